"""The lesson engine: splitting lesson.md, directive checks, {{ }} values, grading, progress, `lessons`."""

from __future__ import annotations

import json
import math
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.lessons import (
    Bits,
    Calc,
    DeviceFigures,
    Measure,
    Predict,
    ProgressStore,
    Prose,
    Quiz,
    evaluate,
    expected_answer,
    fit_request,
    grade,
    load_curriculum,
    num,
    number_readings,
    parse_number,
    reference_gpu,
    render_values,
)
from tutor.lessons.directives import parse_blocks, split_markdown

FIXTURE = Path(__file__).parent / "fixtures" / "lessons"


def directive(name: str, body: str, fence: str = "```") -> str:
    return f"{fence}{name}\n{body.strip()}\n{fence}\n"


def one_block(name: str, body: str):
    [block] = parse_blocks(directive(name, body))
    return block


def parse_error(text: str) -> str:
    with pytest.raises(UserError) as caught:
        parse_blocks(text, "lessons/t/l/lesson.md")
    return str(caught.value)


# ---- splitting ----------------------------------------------------------------------------------


def test_split_keeps_ordinary_code_as_prose_and_finds_directives() -> None:
    text = ("Intro\n\n```python\nprint(1)\n```\n\n" + directive("bits", 'value = "1"')
            + "\nMiddle\n\n~~~~quiz\nid = \"q\"\nquestion = \"?\"\nkind = \"text\"\nanswer = \"a\"\n~~~~\nEnd\n")
    pieces = split_markdown(text)
    assert [(p.directive, p.line) for p in pieces] == [("prose", 1), ("bits", 7), ("prose", 11), ("quiz", 13),
                                                        ("prose", 19)]
    assert "```python" in pieces[0].body


def test_a_directive_inside_a_longer_fence_is_code() -> None:
    text = "````markdown\n```quiz\nnot toml at all\n```\n````\n"
    [piece] = split_markdown(text)
    assert piece.directive == "prose" and "```quiz" in piece.body


def test_a_shorter_or_other_fence_does_not_close_a_directive() -> None:
    text = '````measure\nprobe = "x"\nexplain = """\n```\n~~~\n"""\n````\n'
    assert one_block_text(text).explain == "```\n~~~\n"


def one_block_text(text: str):
    [block] = parse_blocks(text)
    return block


def test_unclosed_directive_names_its_line() -> None:
    assert parse_error("a\n\n```quiz\nid = 'x'\n") == (
        "lessons/t/l/lesson.md:3: the ```quiz block is never closed (add a line ```)")


def test_blocks_carry_line_directive_and_stable_ids() -> None:
    text = "Hello\n\n" + directive("bits", 'value = 0.1') + directive("bits", 'value = "2"\nid = "two"') + "Bye\n"
    blocks = parse_blocks(text)
    assert [(b.directive, b.id, b.line) for b in blocks] == [
        ("prose", "prose-1", 1), ("bits", "bits-1", 3), ("bits", "two", 6), ("prose", "prose-2", 10)]
    assert blocks[1].value == "0.1" and blocks[1].kind == "bits"
    from tutor.theory.formats import FORMATS

    assert blocks[1].formats == tuple(name for name, fmt in FORMATS.items() if fmt.family == "float")
    assert {"fp32", "bf16", "fp16", "fp8-e4m3"} <= set(blocks[1].formats)


# ---- directive checks -------------------------------------------------------------------------


def test_toml_errors_point_at_the_line_in_lesson_md() -> None:
    text = "Intro\n\n```quiz\nid = \"q\"\nquestion = oops\n```\n"
    message = parse_error(text)
    assert message.startswith("lessons/t/l/lesson.md:5: ```quiz block is not valid TOML")


@pytest.mark.parametrize(("body", "line", "expected"), [
    ('value = "1"\ncolour = "red"', 3, "unknown key 'colour'"),
    ('formats = ["bf16"]', 1, "missing required key 'value'"),
    ('value = "1"\nformats = ["bf17"]', 3, "unknown format bf17"),
    ('value = "one"', 2, "not a number"),
    ('value = "1"\nformats = "bf16"', 3, "formats must be a list of text"),
])
def test_bits_mistakes(body: str, line: int, expected: str) -> None:
    message = parse_error(directive("bits", body))
    assert message.startswith(f"lessons/t/l/lesson.md:{line}: ```bits block: ") and expected in message


@pytest.mark.parametrize(("body", "expected"), [
    ('id = "q"\nquestion = "?"\nkind = "essay"\nanswer = "x"', "kind must be one of number, choice, text"),
    ('id = "q"\nquestion = "?"\nkind = "choice"\nchoices = ["a", "b"]\nanswer = 2', "not a choice index (0..1)"),
    ('id = "q"\nquestion = "?"\nkind = "choice"\nchoices = ["a"]\nanswer = 0', "at least two choices"),
    ('id = "q"\nquestion = "?"\nkind = "choice"\nchoices = ["a", "b"]\nanswer = "a"', "0-based index"),
    ('id = "q"\nquestion = "?"\nkind = "number"\nanswer = 1\nanswer_expr = "1"', "exactly one of answer"),
    ('id = "q"\nquestion = "?"\nkind = "number"', "exactly one of answer"),
    ('id = "q"\nquestion = "?"\nkind = "number"\nanswer = "lots"', "is not a number"),
    ('id = "q"\nquestion = "?"\nkind = "number"\nanswer = 1\ntolerance = 2', "tolerance is relative"),
    ('id = "q"\nquestion = "?"\nkind = "text"\nanswer = "x"\ntolerance = 0.1', "tolerance belongs to"),
    ('id = "q"\nquestion = "?"\nkind = "number"\nanswer = 1\nchoices = ["a", "b"]', "choices belong to"),
    ('question = "?"\nkind = "text"\nanswer = "x"', "missing required key 'id'"),
    ('id = "Q 1"\nquestion = "?"\nkind = "text"\nanswer = "x"', "must be lowercase"),
    ('id = "q"\nquestion = "?"\nkind = "text"\nanswer = "x"\nhint = "typo"', "unknown key 'hint'"),
])
def test_quiz_consistency(body: str, expected: str) -> None:
    message = parse_error(directive("quiz", body))
    assert "```quiz block: " in message and expected in message


@pytest.mark.parametrize(("body", "expected"), [
    ('kind = "memory"\nmodel = "llama-9"', "unknown model preset"),
    ('kind = "memory"\nmodel = "llama-3.1-8b"\nseq_len = 4096', "unknown key 'seq_len'"),
    ('kind = "memory"\nmodel = "llama-3.1-8b"\nbatch = 0', "batch must be a whole number"),
    ('kind = "memory"\nmodel = "llama-3.1-8b"\nzero = 4', "zero must be a whole number from 0 to 3"),
    ('kind = "memory"\nmodel = "llama-3.1-8b"\nmode = "serve"', "mode must be one of"),
    ('kind = "memory"\nmodel = "llama-3.1-8b"\nimpl = "triton"', "impl must be one of hf, fused"),
    ('kind = "memory"\nmodel = "llama-3.1-8b"\nattention = "paged"', "attention must be one of eager, sdpa, flash"),
    ('kind = "memory"\nmodel = "llama-3.1-8b"\ndtype = "fp13"', "fp13"),
    ('kind = "roofline"\nzero = 1', "a roofline calculator has no field 'zero'"),
    ('kind = "memory"\nfields = ["model", "m"]', "cannot show m"),
    ('kind = "abacus"', "kind must be one of memory"),
])
def test_calc_fields_are_checked(body: str, expected: str) -> None:
    message = parse_error(directive("calc", body))
    assert "```calc block: " in message and expected in message


def test_calc_values_become_a_fit_request() -> None:
    calc = one_block("calc", 'kind = "memory"\nmodel = "llama-3.1-8b"\nmode = "train"\nseq = 2048\n'
                             'lora_targets = ["q", "v"]\nmemory = "24GiB"\nfields = ["model", "seq"]')
    assert isinstance(calc, Calc) and calc.kind == "memory" and calc.model == "llama-3.1-8b"
    assert calc.fields == ("model", "seq") and calc.values["memory"] == 24 * 2**30
    request = fit_request(calc.values)
    assert (request.mode, request.seq_len, request.lora_targets) == ("train", 2048, ("q", "v"))


@pytest.mark.parametrize(("lines", "impl", "attention"), [
    ("", "hf", "sdpa"),                                       # FitRequest's defaults: transformers, SDPA
    ('impl = "fused"\nattention = "eager"', "fused", "eager"),
    ('attention = "flash"', "hf", "flash"),                   # what lesson blocks written before sdpa say
])
def test_calc_impl_and_attention_reach_the_fit_request(lines: str, impl: str, attention: str) -> None:
    calc = one_block("calc", f'kind = "memory"\nmodel = "llama-3.1-8b"\nmode = "train"\n{lines}\n'
                             'fields = ["model", "impl", "attention"]')
    request = fit_request(calc.values)
    assert (request.impl, request.attention) == (impl, attention)


def test_measure_and_predict_blocks() -> None:
    measure = one_block("measure", 'probe = "matmul"\nparams = { dtypes = ["fp32"], budget_s = 2 }')
    assert measure == Measure(probe="matmul", params={"dtypes": ["fp32"], "budget_s": 2}, explain="",
                              line=1, id="measure-1")
    predict = one_block("predict", 'id = "p"\nquestion = "?"\nprobe = "matmul"\nmetric = "tflops_fp32"')
    assert isinstance(predict, Predict) and predict.params == {} and predict.unit == ""
    assert "missing required key 'metric'" in parse_error(directive("predict", 'id = "p"\nquestion = "?"\nprobe = "x"'))


def test_duplicate_ids_are_refused() -> None:
    quiz = 'id = "same"\nquestion = "?"\nkind = "text"\nanswer = "x"'
    message = parse_error(directive("quiz", quiz) + directive("quiz", quiz))
    assert message == "lessons/t/l/lesson.md:7: id 'same' is already used by the block on line 1"


# ---- values -----------------------------------------------------------------------------------


def test_values_come_from_theory() -> None:
    text = "{{ count(params('llama-3.1-8b').total) }} / {{ int(fmt('fp16').max_finite) }} / {{ fmt('bf16').mantissa_bits }}"
    # Llama-3.1-8B: 8.03B parameters (meta-llama/Llama-3.1-8B model card); FP16 max 65504 (IEEE 754 binary16).
    assert render_values(text) == "8.03B / 65,504 / 7"


def test_seventy_billion_parameters_at_four_precisions() -> None:
    # The figures: 70B parameters at FP32/BF16/INT8 = 280/140/70 GB (4, 2, 1 bytes per parameter).
    text = "{{ gb(memory.weight_bytes(70 * 10**9, 'fp32')) }}/{{ gb(memory.weight_bytes(70 * 10**9, 'bf16')) }}"
    assert render_values(text) == "280/140"


def test_reference_gpu_is_the_h100_sxm_datasheet() -> None:
    # NVIDIA H100 SXM datasheet: 3.35 TB/s, 989 dense BF16 TFLOP/s (1979 with sparsity); memory as the
    # driver reports it (nvidia-smi 81559MiB), not the datasheet's 80 GB.
    gpu = reference_gpu()
    assert (gpu.memory_bytes, gpu.bandwidth_gbps, gpu.peak_tflops("bf16")) == (81559 * 2**20, 3350, 989.4)
    assert render_values("{{ reference_gpu.name }}") == "H100 SXM5 80GB"


def test_device_is_none_or_figures() -> None:
    fake = DeviceFigures(name="Fake", kind="cuda", memory_bytes=10**9, bandwidth_gbps=100.0, tflops={"bf16": 2.0})
    text = "{{ device.name if device else 'no device' }} {{ device.peak_tflops('bf16') if device else 0 }}"
    assert render_values(text) == "no device 0"
    assert render_values(text, device=fake) == "Fake 2"


def test_device_may_be_a_detected_machine() -> None:
    from tutor.hardware import detect_machine

    machine = detect_machine()
    rendered = render_values("{{ device.kind }}", device=machine)
    assert rendered == ("cuda" if machine.gpus else "cpu")


def test_device_figures_of_a_machine_with_an_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    from tutor.hardware import GpuInfo, Machine, NvmlStatus, detect_machine
    from tutor.lessons import device_figures

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", memory_total_bytes=85_520_809_984)
    machine = Machine(cpu=detect_machine().cpu, gpus=[gpu], nvml=NvmlStatus(available=True, reason=None))
    figures = device_figures(machine)
    # NVML's name for the SXM part; dense BF16 989.4 TFLOP/s and 3.35 TB/s from the H100 datasheet.
    assert (figures.kind, figures.name, figures.memory_bytes) == ("cuda", "NVIDIA H100 80GB HBM3", 85_520_809_984)
    assert (figures.peak_tflops("bf16"), figures.bandwidth_gbps) == (989.4, 3350)
    assert render_values("{{ num(device.peak_flops('bf16') / device.bandwidth_bytes_per_s) }}", device=machine) == "295"
    cpu = device_figures(machine, "cpu")
    assert cpu.kind == "cpu" and not cpu.is_gpu and cpu.bandwidth_gbps is None


@pytest.mark.parametrize(("expr", "expected"), [
    ("undefined_name + 1", "NameError"),
    ("1 / 0", "ZeroDivisionError"),
    ("fmt('bf17')", "unknown"),
    ("open('x')", "NameError"),
    ("().__class__", "'__class__' is not allowed"),
    ("__import__('os')", "'__import__' is not allowed"),
    ("models.os.system('true')", "AttributeError"),
    ("fit.replace", "AttributeError"),
    ("[(x for x in ()).gi_frame]", "'gi_frame' is not allowed"),
    ("1 +", "is not a Python expression"),
    ("device.name", "AttributeError"),
])
def test_expression_errors_name_the_expression(expr: str, expected: str) -> None:
    with pytest.raises(UserError) as caught:
        render_values(f"x {{{{ {expr} }}}} y")
    assert expr in str(caught.value) and expected in str(caught.value)


def test_none_is_not_rendered() -> None:
    with pytest.raises(UserError, match="None"):
        render_values("{{ reference_gpu.peak_tflops('fp4') }}")


def test_theory_modules_keep_their_own_names() -> None:
    assert evaluate("fit.FitRequest(mode='train').mode") == "train"
    assert evaluate("models.count_parameters(preset('gpt2')).total") == evaluate("params('gpt2').total")
    assert evaluate("math.log2(1024)") == 10
    assert evaluate("len(fit.COMPONENTS)") == 7


def test_only_the_safe_builtins() -> None:
    assert evaluate("max(1, 2) + min(3, 4) + abs(-1) + len([1]) + sum([1, 2]) + round(1.6) + int(1.0) + float(0)") == 13
    with pytest.raises(UserError, match="NameError"):
        evaluate("print(1)")


@pytest.mark.parametrize(("value", "digits", "text"), [
    (65504, 3, "65,500"), (3.3895313892515355e38, 3, "3.39 × 10³⁸"), (0.25, 3, "0.25"), (0.0039062, 3, "0.00391"),
    (1234567, 3, "1,230,000"), (0, 3, "0"), (2.0, 3, "2"), (1 / 3, 5, "0.33333"),
])
def test_num(value: float, digits: int, text: str) -> None:
    assert num(value, digits) == text


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-1e300, max_value=1e300, allow_nan=False).filter(lambda x: x != 0),
       st.integers(min_value=1, max_value=8))
def test_num_reads_back_within_half_a_unit_in_its_last_digit(value: float, digits: int) -> None:
    shown = parse_number(num(value, digits))
    assert shown is not None
    assert math.isclose(shown, value, rel_tol=0.5 * 10 ** (1 - digits) * 1.0000001)


# ---- grading ----------------------------------------------------------------------------------


def number_quiz(**changes) -> Quiz:
    fields = {"id": "q", "question": "?", "kind": "number", "choices": (), "answer": None,
                  "answer_expr": "float(fmt('bf16').max_finite)", "tolerance": 0.02, "hints": (), "explanation": ""}
    fields.update(changes)
    return Quiz(**fields)


@pytest.mark.parametrize("typed", ["3.39e38", "3.4e38", "3.39 × 10^38", "3.39x10^38", "3.39*10**38",
                                   "339e36", " 3.3895e+38 ", "3.39e38 (about)" [:7]])
def test_bf16_max_in_the_ways_people_type_it(typed: str) -> None:
    # BF16 max finite (2 - 2^-7) * 2^127 = 3.3895e38 (Kalamkar et al., arXiv 1905.12322).
    verdict = grade(number_quiz(), typed)
    assert verdict.correct and verdict.expected == "3.39 × 10³⁸"


@pytest.mark.parametrize(("typed", "message"), [("3.0e38", "too low"), ("6.5e38", "too high")])
def test_wrong_numbers_say_which_way(typed: str, message: str) -> None:
    verdict = grade(number_quiz(), typed)
    assert not verdict.correct and verdict.valid and message in verdict.message


@pytest.mark.parametrize("typed", ["", "lots", "3.4.5", "e5", "inf", "1e999"])
def test_unreadable_numbers_are_invalid_not_wrong(typed: str) -> None:
    verdict = grade(number_quiz(), typed)
    assert not verdict.correct and not verdict.valid


def test_units_and_suffixes() -> None:
    gigabytes = number_quiz(answer="140", answer_expr=None, unit="GB")
    assert grade(gigabytes, "140 GB").correct and grade(gigabytes, "140GB").correct
    assert grade(gigabytes, "140,000,000,000").correct is False
    count = number_quiz(answer_expr="params('llama-3.1-8b').total")
    assert grade(count, "8.03B").correct and grade(count, "8,030,261,248").correct
    assert grade(number_quiz(answer=0.5, answer_expr=None), "50%").correct
    assert grade(number_quiz(answer=0.25, answer_expr=None, tolerance=0.0), "1/4").correct


def test_exact_integer_answer_is_shown_exactly() -> None:
    quiz = number_quiz(answer_expr="int(fmt('fp16').max_finite)", tolerance=0.0)
    assert grade(quiz, "65504").correct and not grade(quiz, "65505").correct
    assert grade(quiz, "1").expected == "65,504"


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1e-30, max_value=1e30), st.floats(min_value=0.001, max_value=0.5))
def test_tolerance_is_relative(expected: float, tolerance: float) -> None:
    quiz = number_quiz(answer=expected, answer_expr=None, tolerance=tolerance)
    assert grade(quiz, repr(expected * (1 + tolerance * 0.9))).correct
    assert not grade(quiz, repr(expected * (1 + tolerance * 1.1))).correct
    assert not grade(quiz, repr(-expected)).correct


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_any_float_repr_reads_back_exactly(value: float) -> None:
    assert number_readings(repr(value))[0] == value


def test_choice_and_text_grading() -> None:
    choice = Quiz(id="c", question="?", kind="choice", choices=("FP16", "BF16", "FP8"), answer=1, answer_expr=None,
                  tolerance=0.0, hints=(), explanation="")
    assert expected_answer(choice) == 1
    assert grade(choice, "1").correct and grade(choice, "bf16").correct and grade(choice, "b").correct
    assert not grade(choice, "0").correct and grade(choice, "0").expected == "BF16"
    assert not grade(choice, "7").valid
    text = Quiz(id="t", question="?", kind="text", choices=(), answer=("significand", "fraction"), answer_expr=None,
                tolerance=0.0, hints=(), explanation="")
    assert grade(text, "  Significand. ").correct and grade(text, "fraction").correct
    assert not grade(text, "exponent").correct and not grade(text, " ").valid


def test_device_dependent_answers() -> None:
    quiz = number_quiz(answer_expr="device.peak_tflops('bf16') if device else reference_gpu.peak_tflops('bf16')")
    fake = DeviceFigures(name="Fake", kind="cuda", memory_bytes=None, bandwidth_gbps=None, tflops={"bf16": 100.0})
    assert expected_answer(quiz) == 989.4
    assert grade(quiz, "100", device=fake).correct and not grade(quiz, "100").correct


def test_a_broken_answer_expr_is_a_user_error() -> None:
    with pytest.raises(UserError, match="not a number"):
        expected_answer(number_quiz(answer_expr="'text'"))


# ---- curriculum -------------------------------------------------------------------------------


def test_fixture_curriculum_loads_in_order() -> None:
    curriculum = load_curriculum(FIXTURE)
    assert [t.id for t in curriculum.tracks] == ["precision", "experts"]
    assert [i.id for i in curriculum.lessons] == ["precision/bits-of-a-float", "precision/weights-in-memory",
                                                  "experts/routing"]
    info = curriculum.info("precision/weights-in-memory")
    assert (info.track, info.minutes, info.prerequisites) == ("precision", 10, ("precision/bits-of-a-float",))
    assert curriculum.next_lesson("precision/weights-in-memory").id == "experts/routing"
    assert curriculum.previous_lesson("precision/bits-of-a-float") is None
    assert curriculum.next_lesson("experts/routing") is None
    lesson = curriculum.lesson("bits-of-a-float")  # a folder name unique across tracks is enough
    assert [type(b) for b in lesson.blocks][:3] == [Prose, Bits, Prose]
    assert lesson is curriculum.lesson("precision/bits-of-a-float")  # parsed once


def test_unknown_lesson_suggests_close_ids() -> None:
    with pytest.raises(UserError, match=r"did you mean precision/bits-of-a-float"):
        load_curriculum(FIXTURE).lesson("precision/bits-of-float")


def copy_fixture(tmp_path: Path) -> Path:
    root = tmp_path / "lessons"
    shutil.copytree(FIXTURE, root)
    return root


@pytest.mark.parametrize(("file", "old", "new", "expected"), [
    ("curriculum.toml", '"experts/routing"]', '"experts/routing", "experts/missing"]',
     "lessons/curriculum.toml:12: lesson 'experts/missing' has no lessons/experts/missing/lesson.toml"),
    ("curriculum.toml", '"precision/weights-in-memory"]', '"precision/weights-in-memory", "precision/bits-of-a-float"]',
     "lessons/curriculum.toml:6: lesson 'precision/bits-of-a-float' is listed twice"),
    ("curriculum.toml", 'lessons = ["experts/routing"]', 'lessons = ["precision/routing"]',
     'must be "experts/<lesson-folder>"'),
    ("experts/routing/lesson.toml", 'id = "experts/routing"', 'id = "experts/routes"',
     "lessons/experts/routing/lesson.toml:1: id is 'experts/routes' but the folder says 'experts/routing'"),
    ("experts/routing/lesson.toml", 'minutes = 6', 'minutes = "six"', "minutes must be whole minutes"),
    ("experts/routing/lesson.toml", 'minutes = 6', 'minutes = 6\nlevel = 2', "unknown key 'level'"),
    ("experts/routing/lesson.toml", '["precision/weights-in-memory"]', '["precision/weights"]',
     "prerequisite 'precision/weights' is not a lesson"),
    ("precision/bits-of-a-float/lesson.toml", "prerequisites = []", 'prerequisites = ["experts/routing"]',
     ("prerequisites form a cycle: precision/bits-of-a-float -> experts/routing -> precision/weights-in-memory "
     "-> precision/bits-of-a-float")),
    ("curriculum.toml", 'title = "Mixture of experts"', 'title = "Mixture', "curriculum.toml:10: not valid TOML"),
])
def test_malformed_curriculum_names_file_and_line(tmp_path: Path, file: str, old: str, new: str, expected: str) -> None:
    root = copy_fixture(tmp_path)
    path = root / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    with pytest.raises(UserError) as caught:
        load_curriculum(root)
    assert expected in str(caught.value)


def test_malformed_lesson_page_names_file_and_line(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    page = root / "experts" / "routing" / "lesson.md"
    page.write_text(page.read_text().replace('answer = "0.25"', 'answer = "a quarter"'))
    curriculum = load_curriculum(root)  # pages are parsed when opened
    with pytest.raises(UserError, match=r"^lessons/experts/routing/lesson.md:16: ```quiz block: answer 'a quarter'"):
        curriculum.lesson("experts/routing")


def test_missing_curriculum(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no lessons found"):
        load_curriculum(tmp_path)


def test_lessons_root_override(monkeypatch: pytest.MonkeyPatch) -> None:
    from tutor.lessons import lessons_root

    monkeypatch.setenv("TENSOR_TUTOR_LESSONS_DIR", str(FIXTURE))
    assert lessons_root() == FIXTURE
    monkeypatch.delenv("TENSOR_TUTOR_LESSONS_DIR")
    assert lessons_root().name in ("lessons", "_lessons")


# ---- progress ---------------------------------------------------------------------------------


def test_progress_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    store = ProgressStore(path)
    assert store.lesson_state("a/b").done_blocks == set() and store.last_lesson is None
    store.mark_block("a/b", "bits-1")
    store.record_answer("a/b", "q1", "3e38", False)
    store.record_answer("a/b", "q1", "3.4e38", True)
    store.record_prediction("a/b", "p1", 2.0, 1.6)
    store.mark_completed("a/b")
    again = ProgressStore(path)
    state = again.lesson_state("a/b")
    assert state.done_blocks == {"bits-1", "q1", "p1"} and state.completed
    assert again.answers("a/b")["q1"].attempts == 2 and again.answers("a/b")["q1"].answer == "3.4e38"
    assert again.predictions("a/b")["p1"].ratio == pytest.approx(1.25)
    assert again.last_lesson == "a/b" and again.warning is None


def test_progress_keeps_what_a_reopened_block_shows(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    store = ProgressStore(path)
    store.record_prediction("a/b", "p1", 0.8, 9.5, typed="800 MB/s")
    store.record_answer("a/b", "q1", "7", False)
    store.record_reveal("a/b", "q1")  # the answer shown: the next visit is round 1, drawn afresh
    store.record_answer("a/b", "q1", "9", True)
    again = ProgressStore(path)
    prediction = again.prediction("a/b", "p1")
    assert prediction is not None and (prediction.typed, prediction.predicted, prediction.measured) == ("800 MB/s", 0.8, 9.5)
    answer = again.answer("a/b", "q1")
    assert answer is not None and (answer.answer, answer.correct, answer.round) == ("9", True, 1)
    assert again.answer("a/b", "q2") is None and again.prediction("a/b", "p2") is None
    # Older files (no typed text, no round) and hand edits read as nothing typed and round 0.
    data = json.loads(path.read_text())
    data["lessons"]["a/b"]["predictions"]["p1"]["typed"] = 42
    data["lessons"]["a/b"]["answers"]["q1"]["round"] = -3
    path.write_text(json.dumps(data))
    damaged = ProgressStore(path)
    assert damaged.prediction("a/b", "p1").typed == "" and damaged.answer("a/b", "q1").round == 0


def test_track_progress_counts_completed_lessons(tmp_path: Path) -> None:
    curriculum = load_curriculum(FIXTURE)
    store = ProgressStore(tmp_path / "progress.json")
    store.mark_completed("precision/weights-in-memory")
    assert store.track_progress(curriculum.track("precision")) == (1, 2)
    assert store.track_progress(curriculum.track("experts")) == (0, 1)


def test_default_path_is_in_the_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    ProgressStore().mark_completed("a/b")
    assert json.loads((tmp_path / "progress.json").read_text())["lessons"]["a/b"]["completed"] is True


def test_corrupt_progress_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    path.write_text("[]")
    store = ProgressStore(path)
    assert store.warning and "progress.json.corrupt-" in store.warning
    store.mark_completed("a/b")
    assert ProgressStore(path).is_completed("a/b")


def test_malformed_entries_are_dropped_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    path.write_text(json.dumps({"last_lesson": 3, "lessons": {"a/b": {"done_blocks": ["x", 4], "completed": "yes",
                                                                      "answers": {"q": "bad"}}, "c/d": 7}}))
    store = ProgressStore(path)
    assert store.lesson_state("a/b").done_blocks == {"x"} and not store.is_completed("a/b")
    assert store.answers("a/b") == {} and store.last_lesson is None


def test_unwritable_folder_keeps_working_in_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    store = ProgressStore(blocker / "progress.json")
    store.mark_block("a/b", "bits-1")
    assert not store.persistent and "cannot save progress" in store.warning
    store.mark_completed("a/b")
    assert store.lesson_state("a/b").done_blocks == {"bits-1"} and store.is_completed("a/b")


def test_two_instances_merge_instead_of_erasing_each_other(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    terminal, browser = ProgressStore(path), ProgressStore(path)
    terminal.mark_block("a/b", "one")
    browser.mark_block("a/b", "two")
    terminal.mark_completed("c/d")
    assert ProgressStore(path).lesson_state("a/b").done_blocks == {"one", "two"}
    assert ProgressStore(path).is_completed("c/d")


def test_concurrent_marks_from_threads_are_all_kept(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    store = ProgressStore(path)
    threads = [threading.Thread(target=lambda n=n: [store.mark_block("a/b", f"{n}-{i}") for i in range(10)])
               for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ProgressStore(path).lesson_state("a/b").done_blocks) == 40


def test_reset(tmp_path: Path) -> None:
    store = ProgressStore(tmp_path / "progress.json")
    store.mark_completed("a/b")
    store.mark_completed("c/d")
    store.reset("a/b")
    assert not ProgressStore(tmp_path / "progress.json").is_completed("a/b")
    store.reset()
    assert not ProgressStore(tmp_path / "progress.json").is_completed("c/d")


# ---- the `lessons` command --------------------------------------------------------------------


def test_lessons_command_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tutor.cli import main

    monkeypatch.setenv("TENSOR_TUTOR_LESSONS_DIR", str(FIXTURE))
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    ProgressStore().mark_completed("experts/routing")
    main(["lessons", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["lessons"][2] == {"id": "experts/routing", "title": "Routing tokens to experts", "track": "experts",
                                  "minutes": 6, "completed": True,
                                  "blocks": [{"kind": "measure", "id": "route"}, {"kind": "quiz", "id": "active-fraction"}]}
    assert [(t["id"], t["completed"], t["total"]) for t in data["tracks"]] == [("precision", 0, 2), ("experts", 1, 1)]


def test_lessons_command_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tutor.cli import main

    monkeypatch.setenv("TENSOR_TUTOR_LESSONS_DIR", str(FIXTURE))
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "120")
    main(["lessons"])
    out = capsys.readouterr().out
    assert "3 lessons in 2 tracks" in out and "precision/weights-in-memory" in out and "0/2" in out


def test_lessons_command_without_curriculum_exits_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    from tutor.cli import main

    monkeypatch.setenv("TENSOR_TUTOR_LESSONS_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        main(["lessons"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith("tensor-tutor: error: no lessons found")


def test_engine_and_lessons_command_import_neither_torch_nor_textual() -> None:
    import subprocess
    import sys

    code = ("import sys, tutor.lessons, tutor.lessons.lint, tutor.commands.lessons, tutor.files.storage, tutor.files.settings\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'textual', 'numpy'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# ---- units and powers, shuffles, draws, goals, seen vs solved, `lessons show` ---------------

from tutor.lessons.goals import check_goal, goal_text
from tutor.lessons.grading import quiz_unit
from tutor.lessons.learner import (
    draw_combinations,
    learner_view,
    personalise,
    render_block,
)
from tutor.lessons.progress import lesson_complete


def _quiz(body: str) -> Quiz:
    return parse_blocks(directive("quiz", body))[0]


@pytest.mark.parametrize(("typed", "unit", "expected"), [
    ("128 KiB", "bytes", 131072.0),
    ("912 MiB", "bytes", 912 * 2**20),
    ("2^-24", "", 2.0**-24),
    ("2**-7", "", 2.0**-7),
    ("2^(-24)", "", 2.0**-24),
    ("1.5 × 2^-7", "", 1.5 * 2.0**-7),
    ("1.5e9 B", "GB", 1.5),
    ("14e9 bytes", "GB", 14.0),
    ("14 GB", "GB", 14.0),
    ("14 GB", "GiB", 14e9 / 2**30),
    ("3.39 × 10^38", "", 3.39e38),
    ("65,504", "", 65504.0),
    ("1/4", "", 0.25),
    ("250 ms", "s", 0.25),
    ("12.9B", "billion", 12.9),
    ("76 GPUs", "", 76.0),
])
def test_number_readings_convert_units_and_powers(typed: str, unit: str, expected: float) -> None:
    assert any(math.isclose(reading, expected, rel_tol=1e-12) for reading in number_readings(typed, unit))


@pytest.mark.parametrize(("typed", "unit"), [("3 s", "GB"), ("12 GB", "ms"), ("banana", ""), ("2^^3", ""), ("", "")])
def test_unreadable_or_wrong_kind_answers_have_no_reading(typed: str, unit: str) -> None:
    assert number_readings(typed, unit) == ()


@pytest.mark.parametrize(("question", "unit", "answer", "typed"), [
    ("How many bytes of KV cache does one token take?", "", 131072, "128 KiB"),
    ("How many bytes does one GPT layer keep?", "", 956301312, "912 MiB"),
    ("How many bytes does one layer keep?", "bytes", 131072, "0.125 MiB"),
    ("How many GB (10^9 bytes) do its weights take?", "", 14, "14e9 bytes"),
    ("How big are the weights?", "GB", 1.5, "1.5e9 B"),
])
def test_the_issue_answers_are_graded_right(question: str, unit: str, answer: float, typed: str) -> None:
    quiz = _quiz(f'id = "q"\nquestion = "{question}"\nkind = "number"\nanswer = {answer!r}\nunit = "{unit}"')
    assert grade(quiz, typed).correct, (question, typed)


def test_bytes_for_a_gb_question_and_powers_for_epsilons() -> None:
    gb_quiz = _quiz('id = "q"\nquestion = "How many GB do 7 billion BF16 parameters take?"\nkind = "number"\n'
                    'answer = 14')
    assert quiz_unit(gb_quiz) == "GB"
    assert grade(gb_quiz, "14e9 bytes").correct and grade(gb_quiz, "14 GB").correct and grade(gb_quiz, "14").correct
    assert not grade(gb_quiz, "14 GiB").correct  # 15.03 GB: converted, not dropped
    eps = _quiz('id = "e"\nquestion = "BF16 epsilon?"\nkind = "number"\nanswer_expr = "float(fmt(\'bf16\').epsilon)"')
    assert grade(eps, "2^-7").correct and grade(eps, "2**-7").correct and not grade(eps, "2^-8").correct
    tiny = _quiz('id = "t"\nquestion = "FP16 smallest subnormal?"\nkind = "number"\n'
                 'answer_expr = "float(fmt(\'fp16\').min_subnormal)"')
    assert grade(tiny, "2^-24").correct


def test_unreadable_answer_is_not_an_attempt() -> None:
    quiz = _quiz('id = "q"\nquestion = "How many GB?"\nkind = "number"\nanswer = 14')
    verdict = grade(quiz, "fourteen")
    assert not verdict.valid and not verdict.correct and verdict.message.startswith("could not read 'fourteen' as a number")
    wrong_kind = grade(quiz, "3 s")
    assert not wrong_kind.valid and "GB" in wrong_kind.message


CHOICE = '''id = "fp16-problem"
question = "What goes wrong in pure FP16 training?"
kind = "choice"
choices = ["overflow above 65,504", "small gradients underflow", "slow matmuls", "nothing"]
answer = 1
feedback = ["overflow is rare", "", "tensor cores run FP16 fast", "something does"]'''


def test_choice_feedback_follows_the_pick() -> None:
    quiz = _quiz(CHOICE)
    verdict = grade(quiz, "0")
    assert not verdict.correct and verdict.feedback == "overflow is rare" and "overflow is rare" in verdict.message
    assert grade(quiz, "1").correct


def test_choice_feedback_needs_one_text_per_choice() -> None:
    with pytest.raises(UserError, match="one text per choice"):
        _quiz(CHOICE.replace('"something does"]', ']'))


def test_shuffle_is_deterministic_per_learner_and_differs_between_learners() -> None:
    quiz = _quiz(CHOICE)
    first = personalise(quiz, learner_id="abc", lesson_id="precision/x")
    again = personalise(quiz, learner_id="abc", lesson_id="precision/x")
    assert first.choices == again.choices and first.answer == again.answer
    orders = {personalise(quiz, learner_id=f"learner-{n}", lesson_id="precision/x").choices for n in range(12)}
    assert len(orders) > 1
    for n in range(12):
        mine = personalise(quiz, learner_id=f"learner-{n}", lesson_id="precision/x")
        assert mine.choices[mine.answer] == "small gradients underflow"
        assert sorted(mine.choices) == sorted(quiz.choices)
        assert dict(zip(mine.choices, mine.feedback)) == dict(zip(quiz.choices, quiz.feedback))
        assert grade(mine, str(mine.answer)).correct
    fixed = _quiz(CHOICE + "\nshuffle = false")
    assert personalise(fixed, learner_id="abc", lesson_id="precision/x").choices == fixed.choices


DRAWN = '''id = "kv"
question = "KV bytes per token of {{ draw.model }} at {{ draw['layers'] }} layers?"
kind = "number"
unit = "bytes"
draw = { model = ["llama-3.1-8b", "qwen2.5-7b", "mistral-7b"], layers = [2, 4] }
answer_expr = "kv_cache.kv_cache_bytes_per_token(layers=draw.layers, kv_heads=preset(draw.model).num_kv_heads, head_dim=preset(draw.model).head_dim)"
explanation = "{{ draw.model }} has {{ preset(draw.model).num_kv_heads }} KV heads."'''


def test_draws_are_per_learner_and_feed_texts_and_answers() -> None:
    quiz = _quiz(DRAWN)
    assert len(draw_combinations(quiz)) == 6
    seen = set()
    for n in range(20):
        mine = learner_view(quiz, learner_id=f"l{n}", lesson_id="memory/x")
        assert mine == learner_view(quiz, learner_id=f"l{n}", lesson_id="memory/x")
        model, layers = mine.drawn["model"], mine.drawn["layers"]
        seen.add((model, layers))
        assert mine.question == f"KV bytes per token of {model} at {layers} layers?"
        assert "{{" not in mine.explanation and model in mine.explanation
        from tutor.lessons.values import preset

        arch = preset(model)
        assert expected_answer(mine) == 2 * layers * arch.num_kv_heads * arch.head_dim * 2
        assert grade(mine, f"{expected_answer(mine) / 1024} KiB").correct
    assert len(seen) > 2
    assert render_block(quiz).question == "KV bytes per token of llama-3.1-8b at 2 layers?"  # unpersonalised: firsts


def test_bad_draws_are_refused() -> None:
    with pytest.raises(UserError, match="non-empty list"):
        _quiz(DRAWN.replace("layers = [2, 4]", "layers = []"))
    with pytest.raises(UserError, match="draw name"):
        _quiz(DRAWN.replace("layers = [2, 4]", "Layers = [2, 4]"))


GOAL = '''kind = "parallel"
model = "llama-3.1-70b"
mode = "train"
seq = 4096
fields = ["dp", "tp", "pp", "zero", "recompute", "recipe"]
goal = { device = "h100", devices_max = 8 }
goal_hints = ["shard over {{ 2 * 4 }} GPUs"]'''


def test_calc_goal_checks_fit_and_device_count_with_theory() -> None:
    calc = parse_blocks(directive("calc", GOAL))[0]
    assert "at most 8 x H100" in goal_text(calc) and "seq 4,096" in goal_text(calc)
    start = check_goal(calc, dict(calc.values))
    assert not start.met and start.message.startswith("does not fit")
    from tutor.hardware.specs import lookup_gpu_spec

    assert start.capacity_bytes == lookup_gpu_spec("h100")[0].memory_bytes  # the driver-reported total
    too_many = check_goal(calc, {"dp": 16, "zero": 3, "recompute": "full"})
    assert not too_many.met and "at most 8" in too_many.message
    met = check_goal(calc, {"tp": 8, "recompute": "full", "recipe": "lora"})
    assert met.met and met.devices == 8 and met.worst_bytes <= met.capacity_bytes
    # fixed values (not in fields) win over what the learner's values say
    assert check_goal(calc, {"tp": 8, "recompute": "full", "recipe": "lora", "seq": 16}).worst_bytes == met.worst_bytes
    assert render_block(calc).goal_hints == ("shard over 8 GPUs",)


def test_calc_goal_errors() -> None:
    with pytest.raises(UserError, match="goal device"):
        parse_blocks(directive("calc", GOAL.replace('"h100"', '"h999-imaginary"')))
    with pytest.raises(UserError, match="goal has no key"):
        parse_blocks(directive("calc", GOAL.replace("devices_max", "gpus")))
    with pytest.raises(UserError, match="belong to a calculator with a goal"):
        parse_blocks(directive("calc", GOAL.replace('goal = { device = "h100", devices_max = 8 }\n', "")))


def test_show_answer_marks_seen_not_solved(tmp_path: Path) -> None:
    from tutor.lessons.model import Lesson

    lesson = Lesson(info=fixture_info(), blocks=parse_blocks(directive("quiz", CHOICE)))
    store = ProgressStore(tmp_path / "progress.json")
    learner = store.learner_id
    assert learner and ProgressStore(tmp_path / "progress.json").learner_id == learner  # saved, stable
    store.record_reveal(lesson.id, "fp16-problem")
    state = store.lesson_state(lesson.id)
    assert "fp16-problem" in state.seen_blocks and "fp16-problem" not in state.done_blocks
    assert not lesson_complete(lesson, state)
    assert store.round_of(lesson.id, "fp16-problem") == 1
    store.record_answer(lesson.id, "fp16-problem", "1", True)
    assert lesson_complete(lesson, store.lesson_state(lesson.id))
    assert store.lesson_state(lesson.id).seen_blocks == frozenset()


def fixture_info():
    from tutor.lessons.model import LessonInfo

    return LessonInfo(id="precision/x", title="X", track="precision", minutes=1, prerequisites=(), summary="")


def test_lessons_show_text_and_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    capsys: pytest.CaptureFixture) -> None:
    from tutor.cli import main

    monkeypatch.setenv("TENSOR_TUTOR_LESSONS_DIR", str(FIXTURE))
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    main(["lessons", "show", "experts/routing"])
    text = capsys.readouterr().out
    assert text.startswith("Routing tokens to experts\n") and "[measure route]" in text
    assert "[quiz active-fraction]" in text and "{{" not in text
    main(["lessons", "show", "routing", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["id"] == "experts/routing"
    kinds = [(block["kind"], block["id"]) for block in data["blocks"] if block["kind"] != "prose"]
    assert kinds == [("measure", "route"), ("quiz", "active-fraction")]
    quiz = next(block for block in data["blocks"] if block["kind"] == "quiz")
    assert quiz["question"] and "answer" not in quiz  # the prompt, never the answer
    with pytest.raises(SystemExit) as exit_:
        main(["lessons", "show", "no-such-lesson"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tensor-tutor: error: unknown lesson") and len(err.strip().splitlines()) == 1


def test_each_lessons_index_lists_the_blocks_that_complete_it_as_the_page_names_them() -> None:
    from tutor.lessons.progress import REQUIRED_TO_COMPLETE, blocks_done, track_blocks_done

    curriculum = load_curriculum()
    for info in curriculum.lessons:
        page = curriculum.lesson(info.id)
        assert info.blocks == tuple(block.id for block in page.blocks if block.directive in REQUIRED_TO_COMPLETE)
    first = curriculum.lessons[0]
    assert len(first.blocks) >= 2
    done = {first.blocks[0], "calc-1", "gone-from-the-page"}  # a calculator does not complete it; a stale id counts not
    assert blocks_done(first, done) == (1, len(first.blocks))
    track = curriculum.track(first.track)
    total = sum(len(curriculum.info(lesson_id).blocks) for lesson_id in track.lesson_ids)
    assert track_blocks_done(track, curriculum.infos, lambda lesson_id: done if lesson_id == first.id else set()) \
        == (1, total)
