"""Exercises where the learner writes one function and the check runs it on many cases, each judged
against tutor.theory (the formulas the lessons quote, each tested against its published source):
the KV cache of a config.json, an INT8 absmax scale, the bytes ZeRO leaves on a GPU, the tokens an
expert's capacity drops. Pure Python: no torch, and no imports in the learner's code either, so the
answer holds the formula rather than calling the library that has it. The first case a function gets
wrong is named, with what that wrong value is (another stage's memory, a cache without GQA, ...),
because the wrong answers learners write are a handful and each has its own lesson.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from tutor.formatting import format_bytes, format_count, format_number
from tutor.labs.exercise_types import Verdict
from tutor.labs.learner_code import Refused, call, learner_function


def _judge(answer: str, name: str, cases: Sequence[dict[str, Any]], expected: Callable[..., Any],
           same: Callable[[Any, Any], bool], explain: Callable[[dict[str, Any], Any, Any], str],
           shown: Callable[[dict[str, Any]], str], right: str) -> Verdict:
    """Run the learner's `name` on every case; passed when each result is `same` as `expected`'s."""
    try:
        function = learner_function(answer, name, imports=False)
        wrong = []
        for case in cases:
            want = expected(**case)
            got = call(function, **case)
            if not same(got, want):
                wrong.append((case, got, want))
    except Refused as refused:
        return Verdict(False, str(refused))
    details = (f"{len(cases) - len(wrong)} of {len(cases)} cases right",)
    if not wrong:
        return Verdict(True, right, details)
    case, got, want = wrong[0]
    return Verdict(False, f"{name}({shown(case)}) gave {_value(got)}, the answer is {_value(want)}: "
                          f"{explain(case, got, want)}", details)


def _value(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return format_number(value, digits=6) if isinstance(value, float) else f"{value:,}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        return None
    return float(value)


def _close(got: Any, want: float, *, absolute: float = 0.5) -> bool:
    number = _number(got)
    return number is not None and abs(number - want) <= max(absolute, 1e-9 * abs(want))


# ---- memory: the KV cache of a config.json ----------------------------------------------------------

KV_MODELS = ("llama-2-7b", "llama-3.1-8b", "qwen2.5-7b", "qwen3-0.6b", "llama-3.2-1b", "llama-3.1-70b")
"""Published config.json files (tutor/presets): MHA, GQA at 4 and 8 KV heads, and two whose head_dim
is given and is not hidden_size / num_attention_heads."""


def _kv_cases() -> list[dict[str, Any]]:
    from tutor.files.models import load_preset

    draw = random.Random(7)
    cases = []
    for name in KV_MODELS:
        config, _info = load_preset(name)
        for _ in range(2):
            cases.append({"config": dict(config), "tokens": draw.choice((1, 1000, 4096, 32768)),
                          "batch": draw.choice((1, 8, 32)), "bytes_per_element": draw.choice((1, 2, 4))})
    return cases


def _kv_expected(config: dict, tokens: int, batch: int, bytes_per_element: int) -> int:
    from tutor.theory.kv_cache import kv_cache_bytes_per_token
    from tutor.theory.models import architecture_from_config

    arch = architecture_from_config(config, str(config.get("model_type", "model")))
    return kv_cache_bytes_per_token(layers=arch.num_layers, kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
                                    bytes_per_element=bytes_per_element) * tokens * batch


def _kv_explain(case: dict[str, Any], got: Any, want: Any) -> str:
    config = case["config"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    number = _number(got)
    if number is None:
        return "return the number of bytes, an int"
    if number and kv_heads != heads and math.isclose(number, want * heads / kv_heads, rel_tol=1e-9):
        return (f"that counts all {heads} attention heads; this model caches K and V for its {kv_heads} KV heads "
                "(num_key_value_heads: grouped-query attention)")
    if config.get("head_dim") and config["head_dim"] * heads != config["hidden_size"]:
        return (f"this config gives head_dim = {config['head_dim']}, which is not hidden_size / num_attention_heads "
                f"= {config['hidden_size'] // heads}: take the config's head_dim when it has one")
    if math.isclose(number, want / 2, rel_tol=1e-9):
        return "half the answer: the cache holds two tensors per layer, K and V"
    return ("the cache is 2 (K and V) x layers x KV heads x head_dim x bytes per element, for every token of every "
            "sequence")


def check_kv_cache_function(answer: str) -> Verdict:
    """kv_cache_bytes(config, tokens, batch, bytes_per_element): the KV cache of `batch` sequences of
    `tokens` tokens for the model of a published config.json, against tutor.theory.kv_cache
    (2·L·kv_heads·head_dim·bytes per token; vLLM's figure for Mistral-Small-3.2-24B)."""
    return _judge(answer, "kv_cache_bytes", _kv_cases(), _kv_expected, lambda got, want: _close(got, want),
                  _kv_explain,
                  lambda case: (f"<{case['config'].get('model_type', 'model')} config, {case['config']['num_hidden_layers']} "
                                f"layers>, tokens={case['tokens']:,}, batch={case['batch']}, "
                                f"bytes_per_element={case['bytes_per_element']}"),
                  f"right: the cache of {len(KV_MODELS)} published configs, MHA and GQA, to the byte")


# ---- precision: an INT8 absmax scale ------------------------------------------------------------------

def _int8_cases() -> list[dict[str, Any]]:
    draw = random.Random(8)
    cases: list[dict[str, Any]] = []
    for size, outlier in ((16, 1.0), (64, 1.0), (64, 40.0), (200, 1.0), (33, -25.0)):
        values = [draw.gauss(0.0, 0.5) for _ in range(size)]
        values[draw.randrange(size)] = outlier * (1 + draw.random())  # the absmax, positive or negative
        cases.append({"values": values})
    cases.append({"values": [-3.0, 1.5, 0.75, -0.001]})
    cases.append({"values": [0.0, 0.0, 0.0]})
    return cases


def _int8_result(got: Any, count: int) -> tuple[list[int], float] | str:
    """(codes, scale) from what the learner returned, or why it is not that."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return "return two things: (codes, scale)"
    codes, scale = got
    if _number(scale) is None:
        return "the scale must be a number"
    if not isinstance(codes, (list, tuple)) or len(codes) != count:
        return f"codes must be a list of {count} integers, one per value"
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in codes):
        return "codes must be whole numbers: round each value / scale to an int"
    return list(codes), float(scale)


def check_int8_absmax(answer: str) -> Verdict:
    """quantize(values) -> (codes, scale): symmetric INT8 with one absmax scale (LLM.int8, arXiv
    2208.07339 §2.1): every code in -127..127, every value back within half a step, and the step no
    larger than tutor.theory.formats.int_absmax_scale's: a larger scale than the absmax needs wastes
    the codes' precision, a smaller one clips."""
    from tutor.theory.formats import quantize_int

    try:
        function = learner_function(answer, "quantize", imports=False)
        cases = _int8_cases()
        worst_ratio = 0.0
        for case in cases:
            values = case["values"]
            theory = quantize_int(values, 8)
            shown = f"a list of {len(values)} values, absmax {format_number(max(abs(v) for v in values))}"
            result = _int8_result(call(function, list(values)), len(values))
            if isinstance(result, str):
                return Verdict(False, f"quantize({shown}): {result}")
            codes, scale = result
            if any(abs(c) > 127 for c in codes):
                return Verdict(False, f"quantize({shown}) gave a code of {max(codes, key=abs)}: INT8's symmetric range "
                                      "is -127..127; the absmax must map to 127, not beyond")
            error = max(abs(c * scale - v) for c, v in zip(codes, values, strict=True))
            step = float(theory.scale)
            if error > step / 2 * (1 + 1e-9) + 1e-15:
                if step and scale > step * 1.001:
                    why = (f"your scale {format_number(scale)} is larger than absmax / 127 = {format_number(step)}: "
                           "the steps are coarser than they need be")
                elif step and scale < step * 0.999:
                    why = (f"your scale {format_number(scale)} is smaller than absmax / 127 = {format_number(step)}: "
                           "the largest values clip at ±127")
                else:
                    why = "round each value / scale to the nearest code, not toward zero"
                return Verdict(False, f"quantize({shown}): a value comes back {format_number(error)} off, more than "
                                      f"half a step ({format_number(step / 2)}): {why}")
            worst_ratio = max(worst_ratio, error / step if step else 0.0)
    except Refused as refused:
        return Verdict(False, str(refused))
    return Verdict(True, f"right: on {len(cases)} tensors every code fits -127..127 and every value comes back within "
                         "half a step of absmax / 127",
                   (f"largest error: {format_number(worst_ratio)} of a step (at most 0.5)",))


# ---- parallelism: what ZeRO leaves on a GPU ----------------------------------------------------------

def _zero_cases() -> list[dict[str, Any]]:
    draw = random.Random(9)
    cases = [{"params": 7_000_000_000, "dp": dp, "stage": stage} for dp, stage in ((8, 0), (8, 1), (8, 2), (8, 3))]
    for _ in range(12):
        cases.append({"params": draw.choice((124_000_000, 1_240_000_000, 8_030_000_000, 70_600_000_000)),
                      "dp": draw.choice((2, 4, 16, 64, 512)), "stage": draw.choice((0, 1, 2, 3))})
    return cases


def _zero_expected(params: int, dp: int, stage: int) -> int:
    from tutor.theory.parallel import zero_model_states

    return zero_model_states(params=params, dp=dp, stage=stage).total


def _zero_explain(case: dict[str, Any], got: Any, want: Any) -> str:
    number = _number(got)
    if number is None:
        return "return the number of bytes"
    for stage in range(4):
        if stage != case["stage"] and abs(number - _zero_expected(case["params"], case["dp"], stage)) <= 3:
            return (f"that is stage {stage}'s memory. Stage 1 shards the optimizer states (12 bytes a parameter), "
                    "stage 2 the gradients too (2), stage 3 the weights too (2); what is not sharded stays whole on "
                    "every GPU")
    return "mixed-precision Adam keeps 2 bytes of weights, 2 of gradients and 12 of optimizer states per parameter"


def check_zero_memory(answer: str) -> Verdict:
    """zero_bytes(params, dp, stage): the model-state bytes on one GPU under ZeRO stage 0-3 with
    mixed-precision Adam (2 + 2 + 12 bytes per parameter), against tutor.theory.parallel.zero_model_states
    (Rajbhandari et al. 2019, arXiv 1910.02054, Figure 1)."""
    return _judge(answer, "zero_bytes", _zero_cases(), _zero_expected,
                  lambda got, want: _close(got, want, absolute=3), _zero_explain,
                  lambda case: f"params={format_count(case['params'])}, dp={case['dp']}, stage={case['stage']}",
                  "right: every stage's bytes per GPU, as the ZeRO paper's Figure 1 counts them")


# ---- mixture of experts: what a capacity factor drops -----------------------------------------------

def _capacity_cases() -> list[dict[str, Any]]:
    draw = random.Random(10)
    cases = [{"loads": [27, 24, 21, 18, 12, 9, 6, 3], "top_k": 1, "capacity_factor": 1.0},
             {"loads": [27, 24, 21, 18, 12, 9, 6, 3], "top_k": 1, "capacity_factor": 1.25},
             {"loads": [40, 35, 30, 20, 15, 10, 5, 5], "top_k": 2, "capacity_factor": 1.0}]
    for _ in range(10):
        experts, top_k = draw.choice((4, 8, 16)), draw.choice((1, 2))
        tokens = draw.choice((60, 100, 257))
        loads = [0] * experts
        for _token in range(tokens):
            for expert in draw.sample(range(experts), top_k):  # k distinct experts per token
                loads[expert if draw.random() < 0.7 else draw.randrange(experts)] += 1
        factor = draw.choice((1.0, 1.1, 1.25, 1.5, 2.0))
        exact = Fraction(top_k * (sum(loads) // top_k), experts) * Fraction(repr(factor))
        if math.ceil(top_k * (sum(loads) // top_k) / experts * factor) == math.ceil(exact):
            cases.append({"loads": loads, "top_k": top_k, "capacity_factor": factor})  # no case hangs on float rounding
    return cases


def _capacity_expected(loads: list[int], top_k: int, capacity_factor: float) -> int:
    from tutor.theory.moe import expert_capacity, tokens_dropped

    tokens = sum(loads) // top_k
    return tokens_dropped(loads, expert_capacity(tokens, len(loads), top_k, capacity_factor)).dropped


def _capacity_explain(case: dict[str, Any], got: Any, want: Any) -> str:
    loads, k, factor = case["loads"], case["top_k"], case["capacity_factor"]
    tokens = sum(loads) // k
    number = _number(got)
    if number is None:
        return "return the number of token assignments dropped"
    without_k = sum(max(0, load - math.ceil(tokens / len(loads) * factor)) for load in loads)
    floored = sum(max(0, load - math.floor(k * tokens / len(loads) * factor)) for load in loads)
    if k > 1 and number == without_k:
        return (f"with top-{k} routing each of the {tokens} tokens fills {k} slots: the capacity counts k x tokens / "
                "experts, times the factor")
    if number == floored:
        return "a capacity is a whole number of slots, rounded up: a fraction of a slot still holds a token"
    return "each expert keeps at most its capacity, ceil(k x tokens / experts x factor); the rest of its load is dropped"


def check_capacity_drops(answer: str) -> Verdict:
    """dropped(loads, top_k, capacity_factor): token assignments over each expert's capacity,
    ceil(k·tokens/E·factor) slots (Switch Transformers eq. 3, GShard's top-2), against
    tutor.theory.moe.expert_capacity and tokens_dropped."""
    return _judge(answer, "dropped", _capacity_cases(), _capacity_expected, lambda got, want: _close(got, want, absolute=0),
                  _capacity_explain,
                  lambda case: f"loads={case['loads']}, top_k={case['top_k']}, capacity_factor={case['capacity_factor']}",
                  "right: the assignments every expert's capacity drops, for top-1 and top-2 routing")



# ---- parallelism: an all-reduce that sends what a ring sends ----------------------------------------

ALLREDUCE_RANKS = (2, 3, 4, 8)
CHUNK_BYTES = 2**20
"""Each rank's buffer is n chunks of 1 MiB: S = n MiB, the sizes the bytes are counted in."""


def _allreduce_run(function, ranks: int) -> tuple[list[list[float]], list[float], list[int]]:
    """Run the learner's allreduce(n, send) on `ranks` simulated ranks: (buffers after, the sums they
    should hold, bytes each rank sent). send(src, dst, chunk, reduce) moves one chunk: added into the
    receiver's (reduce=True) or copied over it (reduce=False). The learner never sees the buffers."""
    draw = random.Random(60 + ranks)
    buffers = [[draw.uniform(-1, 1) for _ in range(ranks)] for _ in range(ranks)]
    sums = [math.fsum(buffers[r][c] for r in range(ranks)) for c in range(ranks)]
    sent = [0] * ranks

    def send(src: int, dst: int, chunk: int, reduce: bool = True) -> None:
        for name, value, top in (("src", src, ranks), ("dst", dst, ranks), ("chunk", chunk, ranks)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < top:
                raise ValueError(f"{name} must be an int from 0 to {top - 1}, got {value!r}")
        if src == dst:
            raise ValueError(f"rank {src} sends to itself: a send crosses a link")
        buffers[dst][chunk] = buffers[dst][chunk] + buffers[src][chunk] if reduce else buffers[src][chunk]
        sent[src] += CHUNK_BYTES

    call(function, ranks, send)
    return buffers, sums, sent


def check_ring_allreduce(answer: str) -> Verdict:
    """allreduce(n, send): leave on every rank the sum of all ranks' buffers, moving data only with
    send(src, dst, chunk, reduce), and send no more per rank than a ring all-reduce,
    2(n-1)/n x S (tutor.theory.parallel.allreduce_bytes_per_rank; Patarasuk and Yuan 2009, the
    bandwidth-optimal all-reduce: a reduce-scatter, then an all-gather)."""
    from tutor.theory.parallel import allreduce_bytes_per_rank

    try:
        function = learner_function(answer, "allreduce", imports=False)
        details = []
        for ranks in ALLREDUCE_RANKS:
            buffers, sums, sent = _allreduce_run(function, ranks)
            size = ranks * CHUNK_BYTES
            ring = allreduce_bytes_per_rank(size, ranks)
            details.append(f"{ranks} ranks: the busiest rank sent {format_bytes(max(sent))}, a ring sends "
                           f"{format_bytes(ring)} each (buffer {format_bytes(size)})")
            for r in range(ranks):
                for c in range(ranks):
                    if not math.isclose(buffers[r][c], sums[c], rel_tol=1e-9, abs_tol=1e-9):
                        return Verdict(False, f"with {ranks} ranks, rank {r}'s chunk {c} is not the sum over all ranks: "
                                              "every rank must end with every summed chunk (after a reduce-scatter "
                                              "each rank holds one; the others still have to travel)", tuple(details))
            busiest = max(sent)
            if busiest > ring:
                r = sent.index(busiest)
                return Verdict(False, f"with {ranks} ranks, rank {r} sent {format_bytes(busiest)}, "
                                      f"{format_number(busiest / ring)}x the {format_bytes(ring)} a ring sends: every rank "
                                      "waits for the busiest link. Spread the work so that each rank sums one chunk",
                               tuple(details))
    except Refused as refused:
        return Verdict(False, str(refused))
    return Verdict(True, "right: every rank holds the sum, and none sent more than 2(n-1)/n of the buffer",
                   tuple(details))
