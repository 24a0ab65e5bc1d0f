"""lab tensor: DTensor column/row-parallel blocks on 2 local ranks against the same blocks on one rank.

One real run: the outputs and gradients match to 1e-4, and the collectives DTensor issues are those
of Megatron-LM §3 (one all-reduce forward and one backward per attention or MLP block: four per layer),
with exactly the bytes tutor.theory.parallel.tensor_parallel_comm_bytes_per_layer gives.
"""

from __future__ import annotations

import json
import threading

import pytest
from rich.console import Console

from tutor.errors import UserError
from tutor.labs import ProbeResult, get_probe, run_probe
from tutor.labs.tensor_parallel import _op_kind, _summarise_block, render_tensor
from tutor.theory.parallel import tensor_parallel_comm_bytes_per_layer

PARAMS = {"ranks": 2, "hidden": 64, "heads": 4, "seq": 16, "batch": 2}


@pytest.fixture(scope="module")
def real_run() -> ProbeResult:
    return get_probe("tensor").run(dict(PARAMS), lambda fraction, message: None, threading.Event())


@pytest.mark.slow
def test_split_blocks_match_one_rank_forward_and_backward(real_run: ProbeResult) -> None:
    data = json.loads(json.dumps(real_run.to_json()))
    assert set(data["blocks"]) == {"column-parallel linear", "row-parallel linear", "mlp", "attention"}
    assert 0.0 <= data["max_abs_error"] < 1e-4
    assert data["max_abs_error"] == max(max(b["forward_error"], b["backward_error"]) for b in data["blocks"].values())


@pytest.mark.slow
def test_collectives_are_megatrons_f_and_g(real_run: ProbeResult) -> None:
    blocks = real_run.details["blocks"]
    # Column-parallel: nothing forward, the input gradient all-reduced backward (Megatron's f).
    assert blocks["column-parallel linear"]["forward"]["collectives"] == {}
    assert blocks["column-parallel linear"]["backward"]["collectives"] == {"all_reduce": 1}
    # Row-parallel: the partial outputs all-reduced forward (g), nothing backward.
    assert blocks["row-parallel linear"]["forward"]["collectives"] == {"all_reduce": 1}
    assert blocks["row-parallel linear"]["backward"]["collectives"] == {}
    for block in ("mlp", "attention"):
        assert blocks[block]["forward"]["collectives"] == blocks[block]["backward"]["collectives"] == {"all_reduce": 1}
    b, s, h = PARAMS["batch"], PARAMS["seq"], PARAMS["hidden"]
    assert blocks["mlp"]["forward"]["buffer_bytes"] == b * s * h * 4


@pytest.mark.slow
def test_bytes_per_layer_equal_the_theory(real_run: ProbeResult) -> None:
    layer = real_run.details["layer"]
    assert layer["allreduces"] == {"forward": 2, "backward": 2}
    theory = tensor_parallel_comm_bytes_per_layer(seq_len=PARAMS["seq"], batch=PARAMS["batch"],
                                                  hidden=PARAMS["hidden"], tp=2, bytes_per_value=4)
    assert layer["bytes_sent_per_rank"] == {"measured": theory, "theory": theory}
    assert real_run.metrics["comm_bytes_over_theory"] == 1.0


@pytest.mark.slow
def test_render_lists_each_block_and_the_layer_beside_megatron(real_run: ProbeResult) -> None:
    console = Console(width=120, record=True, color_system=None)
    console.print(render_tensor(real_run))
    text = console.export_text()
    for label in ("column-parallel linear", "row-parallel linear", "mlp", "attention", "layer (measured)",
                  "layer (Megatron-LM)", "2 x all-reduce", "KiB"):
        assert label in text
    assert "e-0" not in text and "tensor_parallel" not in text


@pytest.mark.slow
def test_separate_qkv_projections_each_all_reduce_their_input_gradient() -> None:
    """Three column-parallel q, k, v modules: DTensor reduces each one's input gradient on its own
    (3 backward all-reduces where a fused projection needs 1); counted as the parent summarises them."""
    size = 2 * 16 * 64 * 4
    rank_view = {"forward_error": 0.0, "backward_error": 1e-7,
                 "forward": [("c10d_functional.all_reduce", size)],
                 "backward": [("_c10d_functional.all_reduce", size)] * 3}
    summary = _summarise_block([rank_view, dict(rank_view, backward_error=3e-7)], world=2)
    assert summary["backward"]["collectives"] == {"all_reduce": 3}
    assert summary["bytes_sent_per_rank"] == 4 * size  # 4 all-reduces x 2(2-1)/2 x buffer
    assert summary["backward_error"] == 3e-7
    assert _op_kind("_c10d_functional.all_gather_into_tensor") == "all_gather"


@pytest.mark.parametrize(("params", "message"), [
    ({"heads": 3}, "tensor: tensor-parallel size 2 does not divide attention heads 3"),
    ({"hidden": 100, "heads": 8}, "hidden 100 is not a multiple of heads 8"),
    ({"qkv": "packed"}, "unknown qkv 'packed'"),
])
def test_bad_parameters_are_one_line_user_errors_before_any_rank_starts(params: dict, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        run_probe("tensor", params)
    assert "\n" not in str(caught.value)
