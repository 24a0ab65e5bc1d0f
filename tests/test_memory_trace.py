"""`fit --trace`: the storage tracker against known bytes, fake tensors against real runs, the CLI's messages.

The real runs are measured with torch's own MemTracker (torch.distributed._tools.mem_tracker) and with
the same tracker on real tensors; the traced (fake) step must agree with both.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest

transformers = pytest.importorskip("transformers")
import torch

from click.testing import CliRunner
from torch._subclasses.fake_tensor import FakeTensorMode

from tutor.trace.memory_trace import (
    CATEGORIES,
    TraceSetup,
    build_config,
    build_model,
    create_optimizer_states,
    storage_tracker_class,
    trace_step,
)
from tutor.cli import main
from tutor.commands.fit import fit
from tutor.errors import UserError

LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)
MIXTRAL = dict(model_type="mixtral", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=256, num_local_experts=4, num_experts_per_tok=2,
               max_position_embeddings=512)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("fake", [False, True])
def test_tracker_counts_each_storage_once_and_frees_it(fake: bool) -> None:
    with FakeTensorMode() if fake else torch.device("cpu"):
        tracker = storage_tracker_class()()
        with tracker:
            tracker.set_phase("forward")
            a = torch.empty(1000)                  # 4,000 B
            view = a[10:]                          # a view: same storage
            a.add_(1)                              # in place: same storage
            b = torch.empty(500, dtype=torch.bfloat16)  # 1,000 B
            assert tracker.live_bytes == 5000
            del b
            assert tracker.live_bytes == 4000
            del a
            assert tracker.live_bytes == 4000      # the view keeps the storage alive
            del view
            assert tracker.live_bytes == 0
        measured = tracker.measurement()
        assert measured.peak.bytes == 5000 and measured.peak.per_category_bytes["activations"] == 5000
        assert measured.peak.phase == "forward" and measured.peak.op == "empty.memory_format"


def _experts_by_where(x, ids, layers: int = 3):
    """DBRX's experts in small: per layer a temporary, and the tokens of one expert picked by torch.where on
    values the token ids decide (aten.nonzero: sized by values, answered from FakeValues' copies on fake
    tensors)."""
    for _ in range(layers):
        temporary = x * 2
        tokens = torch.where(ids % 4 == 0)[0]
        x = x + temporary[tokens].sum()
    return x


def _value_sized_step(fake: bool, layers: int) -> tuple[int, int]:
    """(bytes alive after `_experts_by_where`, the activations' maximum), tracked with the cycle collector off."""
    import gc

    from tutor.trace.memory_trace import _fake_tensor_workarounds

    collecting = gc.isenabled()
    gc.disable()
    try:
        with FakeTensorMode() if fake else contextlib.nullcontext():
            x = torch.empty(64, 128)
            ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(1))  # give_token_ids' values
            with _fake_tensor_workarounds(fake) as values:
                if values is not None:
                    values.give_token_ids(ids, 256)
                for _first_time_too in range(2):  # the second step is measured: torch imports modules on first use
                    gc.collect()
                    tracker = storage_tracker_class()()
                    tracker.register([x, ids], "activations")
                    with tracker:
                        tracker.set_phase("forward")
                        out = _experts_by_where(x, ids, layers)
                        left = tracker.live_bytes
                        del out
        return left, tracker.measurement().max_per_category["activations"]
    finally:
        if collecting:
            gc.enable()


def test_a_value_sized_op_on_fake_tensors_frees_what_the_real_code_frees() -> None:
    """A fake op sized by values raises inside torch and FakeValues answers it from copies; the exception,
    kept, held the frames of every caller (each layer's temporary) until Python's cycle collector ran.
    With the collector off, the fake step holds what the real one holds, whatever its depth."""
    real = _value_sized_step(fake=False, layers=3)
    assert _value_sized_step(fake=True, layers=3) == real
    assert _value_sized_step(fake=True, layers=6) == real


def test_the_peak_is_a_moment_with_its_op_and_what_was_alive() -> None:
    tracker = storage_tracker_class()()
    with tracker:
        tracker.set_phase("forward")
        a = torch.ones(1000)             # 4,000 B
        b = a * 2                        # 4,000 B: 8,000 live
        del a                            # 4,000 live
        c = b.view(10, 100) + 1          # a view shares b's storage; the sum is new: 8,000 live
        d = b[:500].clone()              # 2,000 B: 10,000 live, the peak
        del b, c, d
        e = torch.zeros(100)             # 400 B after everything else was freed
    measured = tracker.measurement()
    assert measured.peak.bytes == 10_000 and measured.peak.phase == "forward" and measured.peak.op == "clone.default"
    assert measured.peak.op_index == 6      # ones, mul, view, add, slice, clone
    assert sorted(n for *_, n in measured.peak.storages) == [2000, 4000, 4000]
    assert measured.peak.activations_by_op == {"mul": 4000, "add": 4000, "clone": 2000}
    assert measured.max_per_category["activations"] == 10_000 and measured.phase_peaks == {"forward": 10_000}
    assert tracker.live_bytes == e.untyped_storage().nbytes() == 400


def test_a_gradient_counts_as_one_from_the_op_that_computed_it() -> None:
    weight = torch.nn.Parameter(torch.ones(256))
    tracker = storage_tracker_class()()
    tracker.register(weight, "weights")
    with tracker:
        tracker.set_phase("backward")
        weight.sum().backward()            # the gradient is made inside backward (AccumulateGrad's copy)
        tracker.mark(weight.grad, "gradients")
    measured = tracker.measurement()
    assert tracker.made_by[tracker.key_of(weight.grad)][0] == "backward"
    assert measured.max_per_category["weights"] == measured.max_per_category["gradients"] == 1024
    assert measured.max_per_category["activations"] < 1024  # the sum and its gradient: scalars


def test_autocast_copies_of_weights_are_weights_other_casts_are_not() -> None:
    linear = torch.nn.Linear(64, 32)
    x = torch.ones(8, 64)
    tracker = storage_tracker_class()()
    tracker.register(linear.parameters(), "weights")
    tracker.autocast_dtype = torch.bfloat16
    with tracker, torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear(x)
        again = linear(x)                  # autocast's cache: the weight is cast once
        upcast = linear.weight.double()    # not to the autocast dtype: a transient, an activation
    measured = tracker.measurement()
    assert tracker.autocast_weight_copies == 2  # weight and bias
    assert measured.max_per_category["weights"] == (64 * 32 + 32) * (4 + 2)
    assert measured.max_per_category["activations"] == (2 * 8 * 64 + 2 * 8 * 32) * 2 + 64 * 32 * 8
    del y, again, upcast


def memtracker_peak(config: dict, setup: TraceSetup) -> dict[str, int]:
    """The real step on CPU, measured by torch's MemTracker: bytes per category at its peak."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model = build_model(config, setup)
    model.train()
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    create_optimizer_states(model, optimizer)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        ids = torch.randint(0, config["vocab_size"], (setup.batch, setup.seq_len))
        labels = ids.clone()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        del loss, ids, labels
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    snapshot = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {str(key).split(".")[-1]: value for key, value in snapshot.items()}


def within(traced: int, real: int, tolerance: float = 0.02) -> bool:
    return abs(traced - real) <= tolerance * max(real, 1)


@pytest.mark.parametrize("config", [LLAMA, MIXTRAL], ids=["llama", "mixtral"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_fake_step_matches_a_real_run_measured_by_memtracker(config: dict, dtype: str) -> None:
    setup = TraceSetup(dtype=dtype, seq_len=128)
    traced = trace_step(config, setup)
    real = memtracker_peak(config, setup)
    at_peak = traced.peak.per_category_bytes
    assert within(traced.peak.bytes, real["Total"])
    assert within(at_peak["weights"], real["PARAM"])
    assert within(at_peak["buffers"], real["BUFFER"])
    assert within(at_peak["gradients"], real["GRAD"])
    assert within(at_peak["optimizer_states"] + at_peak["optimizer_temporaries"], real["OPT"])
    assert within(at_peak["activations"], real["ACT"] + real["TEMP"] + real["OTH"])


@pytest.mark.parametrize("config", [LLAMA, MIXTRAL], ids=["llama", "mixtral"])
@pytest.mark.parametrize("setup", [TraceSetup(dtype="fp32", autocast=True, seq_len=64),
                                   TraceSetup(dtype="bf16", recompute=True, seq_len=64),
                                   TraceSetup(dtype="fp32", attention="eager", seq_len=64, foreach=True),
                                   TraceSetup(mode="inference", dtype="bf16", seq_len=64)],
                         ids=["amp", "recompute", "eager-foreach", "prefill"])
def test_fake_step_matches_the_same_step_on_real_tensors(config: dict, setup: TraceSetup) -> None:
    from dataclasses import replace

    traced, real = trace_step(config, setup), trace_step(config, replace(setup, fake=False))
    assert traced.peak.bytes == real.peak.bytes and traced.peak.phase == real.peak.phase
    assert traced.peak.per_category_bytes == real.peak.per_category_bytes
    assert traced.max_per_category == real.max_per_category
    if setup.mode == "inference":
        assert traced.peak.per_category_bytes["kv_cache"] > 0 and traced.peak.phase == "prefill"


def test_a_model_type_transformers_does_not_know_is_one_clear_error() -> None:
    with pytest.raises(UserError, match="cannot build model_type 'no_such_model'"):
        build_config({**LLAMA, "model_type": "no_such_model"}, "sdpa")


def cli(*argv: str, env_code: str = "") -> subprocess.CompletedProcess:
    code = f"{env_code}\nfrom tutor.cli import main\nmain({list(argv)!r})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensor-tutor: error:"), result.stderr
    for word in words:
        assert word in lines[0]


@pytest.mark.slow
def test_missing_extra_says_what_to_install() -> None:
    result = cli("fit", "llama-3.2-1b", "--trace", env_code="import sys; sys.modules['transformers'] = None")
    assert_one_line_error(result, "pip install -e '.[trace]'")


@pytest.mark.slow
def test_a_config_transformers_rejects_is_one_line_and_exit_2(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "rope_scaling": {"rope_type": "no-such-rope", "factor": 2.0}}))
    assert_one_line_error(cli("fit", str(path), "--trace", "--seq", "64"), "transformers", "cannot build")


@pytest.mark.parametrize("args,words", [
    (["--mode", "train", "--recipe", "mixed"], ["--recipe mixed", "master copy", "--recipe hf-amp", "--recipe bf16"]),
    (["--mode", "train", "--recipe", "bf16", "--tp", "2"], ["one device", "tp 2"]),
    (["--mode", "train", "--recipe", "bf16", "--recompute", "selective"], ["selective"]),
    (["--dtype", "int4"], ["unquantized"]),
])
def test_what_trace_cannot_run_is_refused_in_one_line(args: list[str], words: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main(["fit", "llama-3.2-1b", "--trace", *args])
    assert exit_.value.code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensor-tutor: error:"), err.getvalue()
    assert all(word in lines[0] for word in words), lines[0]


def test_json_carries_the_trace_beside_the_formula(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    result = CliRunner().invoke(fit, [str(path), "--mode", "train", "--recipe", "bf16", "--seq", "64",
                                      "--device", "cpu", "--trace", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    trace = report["trace"]
    assert set(trace["peak"]) >= {"bytes", "phase", "per_category_bytes"}
    assert set(trace["peak"]["per_category_bytes"]) == set(CATEGORIES)
    assert trace["peak"]["bytes"] == sum(trace["peak"]["per_category_bytes"].values())
    assert trace["mode"] == "train" and trace["fake"] is True and trace["target_device"] == "cpu"
    assert trace["vs_formula"]["peak"]["formula_bytes"] == report["peak"]["bytes"]
    assert trace["max_per_category_bytes"]["weights"] == 2 * report["model"]["params_total"]


def test_rendered_trace_shows_both_columns_and_the_phase(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    result = CliRunner().invoke(fit, [str(path), "--seq", "64", "--device", "cpu", "--trace"],
                                catch_exceptions=False, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "peak: traced" in result.output and "peak: fit" in result.output and "prefill" in result.output


def trace_report(tmp_path, config: dict, *args: str) -> dict:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = CliRunner().invoke(fit, [str(path), "--mode", "train", "--seq", "64", *args, "--trace", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("device, optimizer", [("cpu", "single-tensor"), ("h100", "foreach")])
def test_optimizer_temporaries_are_compared_with_the_formulas_optimizer_step(tmp_path, device, optimizer) -> None:
    # A CPU runs single-tensor AdamW, a GPU foreach: the trace follows the target, and so does the formula.
    report = trace_report(tmp_path, LLAMA, "--recipe", "bf16", "--device", device)
    row = report["trace"]["vs_formula"]["categories"]["optimizer_temporaries"]
    assert optimizer in report["trace"]["optimizer"]
    assert row["formula_max"] > 0 and within(row["traced_max"], row["formula_max"], 0.01)


def test_autocast_copies_of_the_weights_are_weights_in_trace_and_formula(tmp_path) -> None:
    report = trace_report(tmp_path, LLAMA, "--recipe", "hf-amp", "--device", "cpu")
    weights = report["trace"]["vs_formula"]["categories"]["weights"]
    assert weights["traced_max"] == weights["formula_max"] > 4 * report["model"]["params_total"]
    assert any("autocast weight copies counted as weights" in note for note in report["trace"]["notes"])


def test_tied_embeddings_are_traced_tied(tmp_path) -> None:
    report = trace_report(tmp_path, {**LLAMA, "tie_word_embeddings": True}, "--recipe", "bf16", "--device", "cpu")
    assert report["trace"]["params"] == report["model"]["params_total"]
    assert report["trace"]["max_per_category_bytes"]["weights"] == 2 * report["model"]["params_total"]


def test_a_traced_prefill_has_its_timeline_beside_the_predicted_one(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    result = CliRunner().invoke(fit, [str(path), "--mode", "inference", "--seq", "64", "--device", "cpu", "--trace",
                                      "--timeline", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    predicted = {m["moment"]: m for m in report["timeline"]}
    traced = report["traced_timeline"]
    assert [m["moment"] for m in traced] == [f"into layer {i}" for i in range(LLAMA["num_hidden_layers"])] + [
        "end of prefill: the next token's logits"]
    for moment in traced:  # the layer boundaries, within the 10% the prefill's categories are held to
        theory = predicted[moment["moment"]]
        assert abs(theory["bytes"] - moment["bytes"]) <= 0.10 * moment["bytes"], moment["moment"]
        assert theory["per_category_bytes"]["kv_cache"] == moment["per_category_bytes"]["kv_cache"]
