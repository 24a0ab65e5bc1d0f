"""Published Hugging Face config.json files of popular models (data, read with importlib.resources)."""
