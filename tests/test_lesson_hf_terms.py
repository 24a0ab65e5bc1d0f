"""The activations lesson picks hf terms out of tutor.theory by name: a renamed term must fail here,
not turn a lesson's figure into a silent 0 B."""

from __future__ import annotations

from tutor.theory import activations
from tutor.files.models import resolve_model

SHAPE = dict(seq_len=4096, batch=1)


def _llama_shape():
    arch, _ = resolve_model("llama-3.1-8b")
    return arch, activations.hf_layer_shape(arch, moe_layer=False)


def test_the_layer_terms_the_lesson_names_exist() -> None:
    _, shape = _llama_shape()
    terms = activations.hf_layer_activation_terms(shape, **SHAPE)
    names = [term.name for term in terms]
    assert sum(term.bytes for term in terms if "norm" in term.name) > 0
    assert names.count("act(gate)") == 1
    eager = activations.hf_layer_activation_terms(shape, **SHAPE, backend="eager")
    assert sum(term.bytes for term in eager if "softmax" in term.name) > 0


def test_the_head_terms_the_lesson_names_exist() -> None:
    arch, shape = _llama_shape()
    terms = activations.hf_model_activation_terms(shape, **SHAPE, vocab=arch.vocab_size)
    assert sum(term.bytes for term in terms if term.block == "head") > 0
    assert [term.name for term in terms if "log-softmax" in term.name]
