"""Checked exercises: every track has at least two, each passes when solved and fails on its starting
point and on the wrong answers learners write (the loopholes included), and each check says what is
wrong in a way a learner can act on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tutor.labs.exercise_checks import CHECKS, check_bf16_rounding, check_expert_placement, check_pipeline_schedule
from tutor.lessons.loader import load_curriculum
from tutor.lessons.model import Exercise

from tests.cli_runner import run

LESSONS = Path(__file__).parent.parent / "lessons"


def exercises() -> list[tuple[str, str, Exercise]]:
    curriculum = load_curriculum(LESSONS)
    found = []
    for track in curriculum.tracks:
        for lesson_id in track.lesson_ids:
            found += [(track.id, lesson_id, block) for block in curriculum.lesson(lesson_id).blocks
                      if isinstance(block, Exercise)]
    return found


def test_every_track_has_at_least_two_exercises() -> None:
    from collections import Counter

    tracks = {track.id for track in load_curriculum(LESSONS).tracks}
    per_track = Counter(track for track, _, _ in exercises())
    assert set(per_track) == tracks and min(per_track.values()) >= 2 and len(exercises()) >= 15, per_track
    assert len({block.check for _, _, block in exercises()}) == len(exercises())  # no check used twice


@pytest.mark.parametrize(("lesson_id", "exercise"), [(lesson, block) for _, lesson, block in exercises()],
                         ids=[block.id for _, _, block in exercises()])
def test_the_solution_passes_and_the_starting_point_fails(lesson_id: str, exercise: Exercise) -> None:
    check = CHECKS[exercise.check]
    if check.needs_torch:
        pytest.importorskip("torch")
    start, solution = check.run(exercise.start), check.run(exercise.solution)
    assert not start.passed and start.message, (lesson_id, start)
    assert solution.passed, (lesson_id, solution)


BF16_RIGHT = """def to_bf16(bits):
    upper, dropped = bits >> 16, bits & 0xFFFF
    if dropped > 0x8000 or (dropped == 0x8000 and upper & 1):
        upper += 1
    return upper
"""


def test_bf16_rounding_passes_ties_to_even_and_names_what_is_wrong() -> None:
    assert check_bf16_rounding(BF16_RIGHT).passed
    truncated = check_bf16_rounding("def to_bf16(bits):\n    return bits >> 16\n")
    assert not truncated.passed and "cut off" in truncated.message
    half_up = check_bf16_rounding("def to_bf16(bits):\n    return (bits + 0x8000) >> 16\n")  # ties away from zero
    assert not half_up.passed and "a tie" in half_up.message
    assert "define a function named to_bf16" in check_bf16_rounding("x = 1").message


@pytest.mark.parametrize("loophole", [
    "0 01111011 1001101",  # the explorer above shows 0.1's BF16 bits: copying them is no function
    "def to_bf16(bits):\n    return 0x3DCD\n",  # 0.1's answer, and nothing else
    "import torch\ndef to_bf16(bits):\n    t = torch.tensor([bits], dtype=torch.int64).to(torch.int32)\n"
    "    return int(t.view(torch.float32).to(torch.bfloat16).view(torch.int16)) & 0xFFFF\n",  # the cast does it
    "def to_bf16(bits):\n    struct = __import__('struct')\n    return bits >> 16\n",
])
def test_bf16_rounding_refuses_answers_without_the_rounding(loophole: str) -> None:
    verdict = check_bf16_rounding(loophole)
    assert not verdict.passed and verdict.message, verdict


def test_the_bf16_answer_is_not_in_the_explorer_above_it() -> None:
    """The lesson's explorer shows any value's BF16 bits; the exercise must not be one of them."""
    [(_, _, exercise)] = [found for found in exercises() if found[2].check == "bf16-rounding"]
    assert exercise.language == "python" and "def to_bf16" in exercise.solution


def test_a_schedule_that_waits_for_later_work_is_a_deadlock() -> None:
    verdict = check_pipeline_schedule("stage 0: B1 F1 F2 F3 F4 B2 B3 B4\nstage 1: F1 B1 F2 B2 F3 B3 F4 B4")
    assert not verdict.passed and verdict.message.startswith("deadlock: stage 0: B1")


def test_gpipe_has_the_bubble_but_too_much_in_flight() -> None:
    verdict = check_pipeline_schedule("stage 0: F1 F2 F3 F4 B1 B2 B3 B4\nstage 1: F1 F2 F3 F4 B1 B2 B3 B4")
    assert not verdict.passed and "holds 4 micro-batches" in verdict.message
    assert "stage 0: idle 20%" in " ".join(verdict.details)  # (p-1)/(m+p-1) = 1/5 for GPipe too


def test_a_schedule_must_run_every_micro_batch_once() -> None:
    verdict = check_pipeline_schedule("stage 0: F1 F2 B1 F3 B2 B3 B4\nstage 1: F1 B1 F2 B2 F3 B3 F4 B4")
    assert not verdict.passed and "stage 0 must run F1..F4 and B1..B4 once each" in verdict.message


def test_expert_placement_names_the_bottleneck() -> None:
    verdict = check_expert_placement("rank 0: 0 1\nrank 1: 2 3\nrank 2: 4 5\nrank 3: 6 7")
    assert not verdict.passed and "rank 0 receives 51 tokens, 1.7x the mean" in verdict.message
    assert "exactly once" in check_expert_placement("rank 0: 0 0\nrank 1: 2 3\nrank 2: 4 5\nrank 3: 6 7").message


def test_expert_placement_hints_teach_without_giving_the_pairing() -> None:
    [(_, _, exercise)] = [found for found in exercises() if found[2].check == "expert-placement"]
    for hint in exercise.hints:
        assert not check_expert_placement(hint).passed
        assert "quietest" not in hint and "pair" not in hint.lower(), hint


def test_no_hint_of_any_exercise_passes_as_its_answer() -> None:
    for _, lesson_id, exercise in exercises():
        check = CHECKS[exercise.check]
        if check.needs_torch:
            continue  # the loops' hints are prose: they do not run
        for hint in exercise.hints:
            assert not check.run(hint).passed, (lesson_id, hint)


ACCUMULATION_START = """optimizer.zero_grad()
for x, y in micro_batches:
    loss = loss_fn(model(x), y){divide}
    loss.backward()
optimizer.step()
"""


def test_accumulation_divides_by_the_k_it_is_given_not_a_number() -> None:
    pytest.importorskip("torch")
    check = CHECKS["accumulation-loop"].run
    assert check(ACCUMULATION_START.format(divide=" / k")).passed
    assert check(ACCUMULATION_START.format(divide=" / len(micro_batches)")).passed
    fixed = check(ACCUMULATION_START.format(divide=" / 4"))  # right for the k = 4 of the prediction only
    assert not fixed.passed and "with k = 2 the gradient is 0.5x" in fixed.message, fixed
    undivided = check(ACCUMULATION_START.format(divide=""))
    assert not undivided.passed and "add up to 2 times the average" in undivided.message


def test_accumulation_refuses_the_whole_batch_in_one_forward() -> None:
    pytest.importorskip("torch")
    whole = """optimizer.zero_grad()
x = torch.cat([x for x, _ in micro_batches])
y = torch.cat([y for _, y in micro_batches])
loss_fn(model(x), y).backward()
optimizer.step()
"""
    verdict = CHECKS["accumulation-loop"].run(whole)
    assert not verdict.passed and "each of the 2 micro-batches" in verdict.message, verdict


LOGITS_KEPT = """kept_logits = []
accuracies = []
for x, y in batches:
    optimizer.zero_grad()
    logits = model(x)
    loss_fn(logits, y).backward()
    optimizer.step()
    kept_logits.append(logits)
    accuracies.append((logits.argmax(-1) == y).float().mean().item())
"""


@pytest.mark.parametrize("loophole", [
    LOGITS_KEPT + "del kept_logits\n",  # freed after the loop: the peak was during it
    LOGITS_KEPT + "kept_logits.clear()\n",
    LOGITS_KEPT.replace("kept_logits.append(logits)", "kept_logits.append(logits.detach().clone())") + "del kept_logits\n",
    # kept where a scan of the loop's names would not look: a function's own list, gone when it returns
    "def train():\n    kept = []\n    for x, y in batches:\n        optimizer.zero_grad()\n        logits = model(x)\n"
    "        loss_fn(logits, y).backward()\n        optimizer.step()\n        kept.append(logits)\n"
    "    return [(l.argmax(-1) == y).float().mean().item() for l, (x, y) in zip(kept, batches)]\n"
    "accuracies = train()\n",
])
def test_logits_alive_reads_the_peak_during_the_loop(loophole: str) -> None:
    pytest.importorskip("torch")
    verdict = CHECKS["logits-alive"].run(loophole)
    assert not verdict.passed and "during the loop" in verdict.message, verdict


def test_a_loop_that_does_not_run_is_a_line_with_its_line_number() -> None:
    pytest.importorskip("torch")
    verdict = CHECKS["accumulation-loop"].run("optimizer.zero_grad()\nfor x, y in micro_batches:\n    nope(x)\n")
    assert not verdict.passed and verdict.message == "your loop did not run: line 3: NameError: name 'nope' is not defined"


def test_the_exercise_lab_runs_from_the_command_line() -> None:
    code, out, _ = run(["lab", "exercise", "check=expert-placement",
                        "answer=rank 0: 0 7\nrank 1: 1 6\nrank 2: 2 5\nrank 3: 3 4", "--json"])
    assert code == 0
    result = json.loads(out)
    assert result["passed"] is True and result["metrics"]["passed"] == 1.0 and result["findings"]


def test_lessons_json_lists_exercises() -> None:
    code, out, _ = run(["lessons", "show", "parallelism/pipeline-parallel", "--json"])
    assert code == 0
    shown = json.loads(out)
    blocks = shown["blocks"] if isinstance(shown, dict) else shown
    [exercise] = [block for block in blocks if block["kind"] == "exercise"]
    assert exercise["check"] == "pipeline-schedule" and exercise["start"].startswith("stage 0: F1 F2 F3 F4")


# ---- the real-clusters layout: fitting is not enough -----------------------------------------------

def _real_clusters_goal():
    from tutor.lessons.model import Calc

    lesson = load_curriculum(LESSONS).lesson("parallelism/real-clusters")
    [calc] = [block for block in lesson.blocks if isinstance(block, Calc) and block.goal is not None]
    return calc


def test_real_clusters_refuses_data_parallelism_alone_for_its_batch() -> None:
    from tutor.lessons.goals import check_goal

    calc = _real_clusters_goal()
    layout = {**calc.values, "dp": 16384, "zero": 3, "recompute": "full"}  # fits in memory, tp = pp = 1
    verdict = check_goal(calc, layout)
    assert not verdict.met and verdict.message.startswith("fits (") and "2.15B tokens" in verdict.message, verdict
    single = check_goal(calc, {**layout, "microbatches": 1})  # 16,384 x 8,192: still 8 times Llama 3's batch
    assert not single.met and "134M tokens" in single.message, single


def test_real_clusters_refuses_a_layout_whose_step_waits_on_zero3_gathers() -> None:
    from tutor.lessons.goals import check_goal

    calc = _real_clusters_goal()
    layout = {**calc.values, "dp": 2048, "zero": 3, "recompute": "full", "microbatches": 1}  # a 16.8M-token step
    verdict = check_goal(calc, layout)
    assert not verdict.met and "days, more than the 200 allowed" in verdict.message, verdict
    assert "longest part is communication" in verdict.message


def test_real_clusters_accepts_a_layout_that_fits_with_its_batch_and_days() -> None:
    from tutor.lessons.goals import check_goal

    calc = _real_clusters_goal()
    layout = {**calc.values, "tp": 8, "pp": 16, "dp": 128, "zero": 1, "sequence_parallel": True, "recompute": "full"}
    verdict = check_goal(calc, layout)
    assert verdict.met, verdict
    too_many_microbatches = check_goal(calc, {**layout, "microbatches": 128})  # a smaller bubble, a 134M-token step
    assert not too_many_microbatches.met and "134M tokens" in too_many_microbatches.message


def test_a_goal_on_days_needs_the_tokens_and_a_positive_bound() -> None:
    from tutor.errors import UserError
    from tutor.lessons.directives import parse_blocks

    block = ('```calc\nkind = "parallel"\nmodel = "llama-3.1-8b"\nmode = "train"\nfields = ["dp"]\n'
             'goal = {{ device = "h100", {goal} }}\n```\n')
    with pytest.raises(UserError, match="train_tokens and days_max go together"):
        parse_blocks(block.format(goal="days_max = 10"))
    with pytest.raises(UserError, match="days_max must be a number above 0"):
        parse_blocks(block.format(goal='train_tokens = "1T", days_max = 0'))
    [calc] = parse_blocks(block.format(goal='train_tokens = "1T", days_max = 10, tokens_per_step_max = 4096'))
    assert calc.goal.train_tokens == 10**12 and calc.goal.days_max == 10.0 and calc.goal.tokens_per_step_max == 4096


# ---- write-a-function exercises: the wrong answers learners write are each refused ----------------

KV_RIGHT = """def kv_cache_bytes(config, tokens, batch, bytes_per_element):
    layers = config["num_hidden_layers"]
    kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * layers * kv_heads * head_dim * bytes_per_element * tokens * batch
"""
INT8_RIGHT = """def quantize(values):
    absmax = max(abs(v) for v in values)
    if absmax == 0:
        return [0] * len(values), 0.0
    return [round(v / (absmax / 127)) for v in values], absmax / 127
"""
ZERO_RIGHT = """def zero_bytes(params, dp, stage):
    weights, grads, optimizer = 2 * params, 2 * params, 12 * params
    if stage >= 1: optimizer /= dp
    if stage >= 2: grads /= dp
    if stage >= 3: weights /= dp
    return weights + grads + optimizer
"""
DROPS_RIGHT = """def dropped(loads, top_k, capacity_factor):
    tokens = sum(loads) // top_k
    slots = top_k * tokens * capacity_factor / len(loads)
    capacity = int(slots) + (slots > int(slots))
    return sum(max(0, load - capacity) for load in loads)
"""
PAGED_RIGHT = """def blocks(lengths, block_size, shared_prefix):
    shared = shared_prefix // block_size
    return shared + sum(-(-(length - shared * block_size) // block_size) for length in lengths)
"""
BATCHING_RIGHT = """def finish_steps(outputs, batch):
    free = [0] * min(batch, len(outputs))
    finish = []
    for length in outputs:
        slot = free.index(min(free))
        free[slot] += length
        finish.append(free[slot])
    return finish
"""
STATIC_BATCHING = """def finish_steps(outputs, batch):
    finish, end = [], 0
    for start in range(0, len(outputs), batch):
        end += max(outputs[start:start + batch])
        finish += [end] * len(outputs[start:start + batch])
    return finish
"""
FUNCTION_ANSWERS = [
    ("paged-blocks", PAGED_RIGHT, ""),
    ("paged-blocks", "def blocks(lengths, block_size, shared_prefix):\n    return sum(-(-n // block_size) for n in lengths)\n",
     "stored once"),  # no sharing
    ("paged-blocks", PAGED_RIGHT.replace("shared = shared_prefix // block_size", "shared = -(-shared_prefix // block_size)"),
     "only the prefix's full blocks"),  # the prefix's partial block shared too
    ("paged-blocks", PAGED_RIGHT.replace("-(-(length - shared * block_size) // block_size)",
                                         "(length - shared * block_size) // block_size"), "round up"),
    ("continuous-batching", BATCHING_RIGHT, ""),
    ("continuous-batching", STATIC_BATCHING, "that is static batching"),
    ("continuous-batching", BATCHING_RIGHT.replace("slot = free.index(min(free))", "slot = len(finish) % len(free)"),
     "whichever slot frees first"),
    ("continuous-batching", BATCHING_RIGHT.replace("finish.append(free[slot])", "finish.append(length)"), "gave"),
    ("kv-cache-bytes", KV_RIGHT, ""),
    ("kv-cache-bytes", KV_RIGHT.replace('config.get("num_key_value_heads", config["num_attention_heads"])',
                                        'config["num_attention_heads"]'), "grouped-query attention"),
    ("kv-cache-bytes", KV_RIGHT.replace('config.get("head_dim") or ', ""), "take the config's head_dim"),
    ("kv-cache-bytes", KV_RIGHT.replace("return 2 *", "return"), "K and V"),
    ("kv-cache-bytes", "def kv_cache_bytes(config, tokens, batch, bytes_per_element):\n    return 131072 * tokens * batch\n",
     "gave"),  # Llama-3.1-8B's bytes per token in BF16, typed in: right for one model only
    ("kv-cache-bytes", "from tutor.theory import kv_cache\ndef kv_cache_bytes(config, tokens, batch, bytes_per_element):\n"
                       "    return 0\n", "no imports"),
    ("int8-absmax", INT8_RIGHT, ""),
    ("int8-absmax", INT8_RIGHT.replace("round(", "int("), "nearest code"),
    ("int8-absmax", INT8_RIGHT.replace("absmax / 127", "absmax / 128"), "-127..127"),
    ("int8-absmax", INT8_RIGHT.replace("abs(v) for v in values", "v for v in values"), "gave a code of"),
    ("int8-absmax", INT8_RIGHT.replace("absmax / 127", "absmax / 100"), "larger than absmax / 127"),
    ("int8-absmax", INT8_RIGHT.replace("    if absmax == 0:\n        return [0] * len(values), 0.0\n", ""),
     "ZeroDivisionError"),
    ("zero-memory", ZERO_RIGHT, ""),
    ("zero-memory", "def zero_bytes(params, dp, stage):\n    return 16 * params / dp if stage else 16 * params\n",
     "that is stage 3's memory"),
    ("zero-memory", ZERO_RIGHT.replace("if stage >= 2: grads /= dp", ""), "that is stage 1's memory"),
    ("capacity-drops", DROPS_RIGHT, ""),
    ("capacity-drops", DROPS_RIGHT.replace("top_k * tokens *", "tokens *"), "fills 2 slots"),
    ("capacity-drops", DROPS_RIGHT.replace(" + (slots > int(slots))", ""), "rounded up"),
    ("capacity-drops", DROPS_RIGHT.replace(" * capacity_factor", ""), "gave"),
]


@pytest.mark.parametrize(("check", "answer", "refusal"), FUNCTION_ANSWERS,
                         ids=[f"{check}-{index}" for index, (check, _, _) in enumerate(FUNCTION_ANSWERS)])
def test_a_function_exercise_passes_only_with_the_idea(check: str, answer: str, refusal: str) -> None:
    verdict = CHECKS[check].run(answer)
    if not refusal:
        assert verdict.passed, verdict
    else:
        assert not verdict.passed and refusal in verdict.message, verdict


RING = """def allreduce(n, send):
    for step in range(n - 1):
        for rank in range(n):
            send(rank, (rank + 1) % n, (rank - step) % n, reduce=True)
    for step in range(n - 1):
        for rank in range(n):
            send(rank, (rank + 1) % n, (rank + 1 - step) % n, reduce=False)
"""
STAR = """def allreduce(n, send):
    for rank in range(1, n):
        for chunk in range(n):
            send(rank, 0, chunk, reduce=True)
    for rank in range(1, n):
        for chunk in range(n):
            send(0, rank, chunk, reduce=False)
"""


@pytest.mark.parametrize(("answer", "refusal"), [
    (RING, ""),
    (STAR, "1.5x the 4 MiB a ring sends"),  # right sums, rank 0 the bottleneck
    (RING.split("    for step in range(n - 1):\n        for rank in range(n):\n            send(rank, (rank + 1) % n, "
                "(rank + 1 - step)")[0], "is not the sum over all ranks"),  # the reduce-scatter alone
    ("def allreduce(n, send):\n    for a in range(n):\n        for b in range(n):\n            if a != b:\n"
     "                for c in range(n):\n                    send(a, b, c)\n", "is not the sum"),  # adds twice
    ("def allreduce(n, send):\n    send(0, 0, 0)\n", "sends to itself"),
])
def test_ring_allreduce_needs_the_sums_everywhere_and_a_ring_s_bytes(answer: str, refusal: str) -> None:
    verdict = CHECKS["ring-allreduce"].run(answer)
    assert verdict.passed if not refusal else (not verdict.passed and refusal in verdict.message), verdict


DECODE_RIGHT = """def step(x, cache):
    q, k, v = qkv(x)
    if cache is not None:
        k, v = torch.cat([cache[0], k]), torch.cat([cache[1], v])
    return attend(q, k, v), (k, v)
"""
EVAL_RIGHT = """@torch.no_grad()
def evaluate(model, batches):
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        total += loss_fn(model(x), y).item() * len(y)
        count += len(y)
    model.train()
    return total / count
"""
RESUME_RIGHT = """def save(model, optimizer):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()}

def load(model, optimizer, state):
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
"""
MASTER_RIGHT = """def step(weights, master, grad, lr):
    if master is None:
        master = weights.float()
    master = master - lr * grad
    return master.to(torch.bfloat16), master
"""
MOE_RIGHT = """def moe_forward(x, router_logits, experts, k):
    top, chosen = router_logits.topk(k, dim=-1)
    gates = torch.softmax(top, dim=-1)
    y = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        token, slot = (chosen == e).nonzero(as_tuple=True)
        if len(token):
            y[token] += gates[token, slot].unsqueeze(-1) * expert(x[token])
    return y
"""
TORCH_ANSWERS = [
    ("kv-decode", DECODE_RIGHT, ""),
    ("kv-decode", "def step(x, cache):\n    xs = x if cache is None else torch.cat([cache, x])\n"
                  "    q, k, v = qkv(xs)\n    return attend(q[-1:], k, v), xs\n", "were computed again"),  # no cache
    ("kv-decode", "def step(x, cache):\n    q, k, v = qkv(x)\n    return attend(q, k, v), None\n", "attended to only itself"),
    ("kv-decode", DECODE_RIGHT.replace("return attend(q, k, v), (k, v)", "return attend(q, k, v), cache"),
     "attended to only itself"),  # the cache never kept
    ("eval-loop", EVAL_RIGHT, ""),
    ("eval-loop", EVAL_RIGHT.replace(" * len(y)", "").replace("count += len(y)", "count += 1"), "mean of the 4 batch means"),
    ("eval-loop", EVAL_RIGHT.replace("@torch.no_grad()\n", ""), "recorded a graph"),
    ("eval-loop", EVAL_RIGHT.replace("    model.eval()\n", "").replace("    model.train()\n", ""), "training mode"),
    ("eval-loop", EVAL_RIGHT.replace("    model.train()\n", ""), "still in eval mode"),
    ("eval-loop", EVAL_RIGHT.replace("total, count = 0.0, 0", "total, count = 0, 0").replace(".item()", ""),
     "returned a tensor"),
    ("checkpoint-resume", RESUME_RIGHT, ""),
    ("checkpoint-resume", RESUME_RIGHT.replace(', "optimizer": optimizer.state_dict()', "")
     .replace('    optimizer.load_state_dict(state["optimizer"])\n', ""), "Adam restarted from zero moments"),
    ("checkpoint-resume", RESUME_RIGHT.replace(', "rng": torch.get_rng_state()', "")
     .replace('    torch.set_rng_state(state["rng"])\n', ""), "random number generator"),
    ("checkpoint-resume", 'def save(model, optimizer):\n    return {"model": model}\n\n'
                          'def load(model, optimizer, state):\n    model.load_state_dict(state["model"].state_dict())\n',
     "cannot be written and read back"),
    ("master-weights", MASTER_RIGHT, ""),
    ("master-weights", "def step(weights, master, grad, lr):\n    return (weights - lr * grad).to(torch.bfloat16), master\n",
     "rounding to BF16 after every step"),
    ("master-weights", "def step(weights, master, grad, lr):\n"
                       "    return (weights.float() - lr * grad).to(torch.bfloat16), None\n", "throws it away"),
    ("master-weights", "def step(weights, master, grad, lr):\n    w = weights.float() - lr * grad\n    return w, w\n",
     "stay a BF16 tensor"),
    ("moe-dispatch", MOE_RIGHT, ""),
    ("moe-dispatch", "def moe_forward(x, router_logits, experts, k):\n    top, chosen = router_logits.topk(k, dim=-1)\n"
                     "    gates = torch.softmax(top, dim=-1)\n    y = torch.zeros_like(x)\n"
                     "    for e, expert in enumerate(experts):\n"
                     "        y += (gates * (chosen == e)).sum(-1, keepdim=True) * expert(x)\n    return y\n",
     "running every expert on every token"),
    ("moe-dispatch", MOE_RIGHT.replace("top, chosen = router_logits.topk(k, dim=-1)\n    gates = torch.softmax(top, dim=-1)",
                                       "gates, chosen = torch.softmax(router_logits, dim=-1).topk(k, dim=-1)"),
     "softmax over all experts"),
]


@pytest.mark.parametrize(("check", "answer", "refusal"), TORCH_ANSWERS,
                         ids=[f"{check}-{index}" for index, (check, _, _) in enumerate(TORCH_ANSWERS)])
def test_a_torch_exercise_passes_only_with_the_idea(check: str, answer: str, refusal: str) -> None:
    pytest.importorskip("torch")
    verdict = CHECKS[check].run(answer)
    if not refusal:
        assert verdict.passed, verdict
    else:
        assert not verdict.passed and refusal in verdict.message, verdict


def test_a_goal_on_days_is_checked_without_torch() -> None:
    """The app checks a calculator's goal in its own process, which never imports torch: the counted
    step comes from tutor.theory on a card's sourced ceilings, not from a measurement."""
    import os
    import subprocess

    from tests.subprocess_env import pythonpath

    code = ("import sys\nfrom pathlib import Path\nfrom tutor.lessons.loader import load_curriculum\n"
            "from tutor.lessons.goals import check_goal\nfrom tutor.lessons.model import Calc\n"
            f"lesson = load_curriculum(Path({str(LESSONS)!r})).lesson('parallelism/real-clusters')\n"
            "[calc] = [b for b in lesson.blocks if isinstance(b, Calc) and b.goal]\n"
            "print(check_goal(calc, {**calc.values, 'dp': 2048, 'zero': 3, 'recompute': 'full', 'microbatches': 1}).met,"
            " 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": pythonpath(Path(__file__).parent.parent)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]
