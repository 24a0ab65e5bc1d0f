"""tensor-tutor: learn the hardware behind large language models, measured on your own machine."""

__version__ = "0.1.0"
