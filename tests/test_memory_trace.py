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
torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from tutor.bench.memory_trace import (  # noqa: E402
    CATEGORIES,
    TraceSetup,
    build_config,
    build_model,
    create_optimizer_states,
    storage_tracker_class,
    trace_step,
)
from tutor.cli import main  # noqa: E402
from tutor.commands.fit import fit  # noqa: E402
from tutor.errors import UserError  # noqa: E402

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
            a = torch.empty(1000)                  # 4,000 B
            view = a[10:]                          # a view: same storage
            a.add_(1)                              # in place: same storage
            b = torch.empty(500, dtype=torch.bfloat16)  # 1,000 B
            assert tracker.total == 5000
            del b
            assert tracker.total == 4000
            del a
            assert tracker.total == 4000           # the view keeps the storage alive
            del view
            assert tracker.total == 0
        assert tracker.peak.bytes == 5000 and tracker.peak.per_category_bytes["activations"] == 5000


@pytest.mark.parametrize("fake", [False, True])
def test_tracker_moves_accumulated_gradients_out_of_activations(fake: bool) -> None:
    with FakeTensorMode() if fake else torch.device("cpu"):
        weight = torch.nn.Parameter(torch.empty(256))
        tracker = storage_tracker_class()()
        tracker.add(weight, "weights")
        hook = weight.register_post_accumulate_grad_hook(lambda p: tracker.classify(p.grad, "gradients"))
        with tracker:
            loss = (weight * 2).sum()
            loss.backward()
            del loss
        hook.remove()
        assert tracker.totals["weights"] == 1024
        assert tracker.totals["gradients"] == 1024
        assert tracker.totals["activations"] == 0


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


def test_missing_extra_says_what_to_install() -> None:
    result = cli("fit", "llama-3.2-1b", "--trace", env_code="import sys; sys.modules['transformers'] = None")
    assert_one_line_error(result, "tensor-tutor[trace]")


def test_a_config_transformers_rejects_is_one_line_and_exit_2(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "rope_scaling": {"rope_type": "no-such-rope", "factor": 2.0}}))
    assert_one_line_error(cli("fit", str(path), "--trace", "--seq", "64"), "transformers", "cannot build")


@pytest.mark.parametrize("args,words", [
    (["--mode", "train", "--recipe", "mixed"], ["bf16", "mixed"]),
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
