"""Exercises where the learner's code runs with torch on a tiny model, in the measurement worker: a
decode step with a KV cache, an evaluation pass, a checkpoint that resumes exactly, an update that
keeps FP32 master weights, a mixture-of-experts layer that runs each expert on its own tokens only.

Each check drives the learner's function itself (token by token, step by step), so the answer must
work the way the real system works, and it measures what the idea is about (rows projected, tensors
saved for a backward, the weights after a resume, how far the weights moved, rows each expert ran),
beside the result compared with a reference computed here the plain way. Every model is a few
thousand parameters: a check takes well under a second of compute on one CPU core.
"""

from __future__ import annotations

import math
from typing import Any

from tutor.formatting import format_count, format_number, format_percent
from tutor.labs.exercise_types import Verdict
from tutor.labs.learner_code import Refused, call, learner_function

# ---- memory: a decode step with a KV cache ---------------------------------------------------------

DECODE_WIDTH, DECODE_TOKENS = 16, 12


def _attention_parts(rows: list[int]):
    """qkv(x) -> (q, k, v) for rows of x (counting the rows it projects) and attend(q, K, V) -> one
    query's output: softmax(q·Kᵀ/√d)·V (Vaswani et al. 2017, eq. 1), on fixed random weights."""
    import torch

    generator = torch.Generator().manual_seed(11)
    weights = [torch.randn(DECODE_WIDTH, DECODE_WIDTH, generator=generator) / math.sqrt(DECODE_WIDTH)
               for _ in range(3)]

    def qkv(x):
        rows.append(int(x.shape[0]))
        return x @ weights[0], x @ weights[1], x @ weights[2]

    def attend(q, K, V):
        return torch.softmax(q @ K.T / math.sqrt(DECODE_WIDTH), dim=-1) @ V

    return qkv, attend


def check_kv_decode(answer: str) -> Verdict:
    """step(x, cache) -> (output, cache): one decode step of causal single-head attention for the new
    token x (1 × d), the cache being whatever the previous step returned (None at first). The check
    feeds 12 tokens one at a time, as generation does; each output must equal full causal attention's
    for that position, and each step must project only the new token (a KV cache: O(n) projections
    in all instead of O(n²))."""
    import torch

    rows: list[int] = []
    qkv, attend = _attention_parts(rows)
    tokens = torch.randn(DECODE_TOKENS, DECODE_WIDTH, generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        q, k, v = qkv(tokens)
        scores = q @ k.T / math.sqrt(DECODE_WIDTH)
        scores = scores.masked_fill(torch.ones_like(scores).triu(1).bool(), float("-inf"))
        reference = torch.softmax(scores, dim=-1) @ v
    rows.clear()
    try:
        step = learner_function(answer, "step", given={"torch": torch, "qkv": qkv, "attend": attend})
        cache: Any = None
        per_step = []
        for i in range(DECODE_TOKENS):
            before = sum(rows)
            result = call(step, tokens[i:i + 1].clone(), cache)
            if not isinstance(result, tuple) or len(result) != 2:
                return Verdict(False, "step must return two things: (output, cache)")
            output, cache = result
            per_step.append(sum(rows) - before)
            if not isinstance(output, torch.Tensor) or output.numel() != DECODE_WIDTH:
                return Verdict(False, f"step {i + 1}: the output must be a tensor of {DECODE_WIDTH} numbers (1 × d)")
            error = float((output.reshape(-1) - reference[i]).abs().max())
            if error > 1e-4:
                seen = "only itself" if i and float((output.reshape(-1) - v[i]).abs().max()) < 1e-4 else "the wrong tokens"
                return Verdict(False, f"token {i + 1}'s output is off by {format_number(error)}: it attended to {seen}; "
                                      f"it must attend to all {i + 1} tokens so far, their keys and values")
    except Refused as refused:
        return Verdict(False, str(refused))
    projected = sum(per_step)
    without_cache = DECODE_TOKENS * (DECODE_TOKENS + 1) // 2
    flops = 3 * 2 * DECODE_WIDTH * DECODE_WIDTH
    details = (f"rows projected to q, k, v: {projected} for {DECODE_TOKENS} tokens (without a cache: {without_cache})",
               f"projection FLOPs: {format_count(projected * flops)} against {format_count(without_cache * flops)}")
    if max(per_step) > 1:
        worst = per_step.index(max(per_step))
        return Verdict(False, f"step {worst + 1} projected {per_step[worst]} tokens: the keys and values of earlier tokens "
                              "were computed again. Keep them from the step that made them", details)
    return Verdict(True, "right: every output is full causal attention's, and each step projects only its new token",
                   details)


# ---- training loop: an evaluation pass -------------------------------------------------------------

EVAL_SIZES = (8, 8, 8, 3)
"""A held-out set whose last batch is short, as a data loader without drop_last gives."""


def _eval_model():
    import torch
    from torch import nn

    torch.manual_seed(21)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 4))
    generator = torch.Generator().manual_seed(22)
    batches = [(torch.randn(n, 16, generator=generator), torch.randint(0, 4, (n,), generator=generator))
               for n in EVAL_SIZES]
    return model, batches


def check_eval_loop(answer: str) -> Verdict:
    """evaluate(model, batches) -> float: the mean loss per held-out example, with dropout off
    (model.eval()), no graph recorded (torch.no_grad: nothing saved for a backward), each example
    weighted once even when the last batch is short, and the model handed back in training mode."""
    import torch
    from torch import nn

    model, batches = _eval_model()
    loss_fn = nn.CrossEntropyLoss()
    model.eval()
    with torch.no_grad():
        losses = [float(loss_fn(model(x), y)) for x, y in batches]
    model.train()
    reference = sum(loss * len(y) for loss, (_, y) in zip(losses, batches, strict=True)) / sum(EVAL_SIZES)
    mean_of_means = sum(losses) / len(losses)
    modes: list[bool] = []
    model.register_forward_pre_hook(lambda module, _inputs: modes.append(module.training))
    saved = [0]

    def pack(tensor):
        saved[0] += 1
        return tensor

    try:
        evaluate = learner_function(answer, "evaluate", given={"torch": torch, "loss_fn": loss_fn})
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            result = call(evaluate, model, batches)
    except Refused as refused:
        return Verdict(False, str(refused))
    details = (f"forward passes: {len(modes)}, in training mode: {sum(modes)}",
               f"tensors saved for a backward: {saved[0]}")
    if isinstance(result, torch.Tensor):
        return Verdict(False, "evaluate returned a tensor: return a number (.item()), which holds no graph", details)
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        return Verdict(False, f"evaluate must return a number, the mean loss; it returned {type(result).__name__}", details)
    if any(modes):
        return Verdict(False, "the forward passes ran in training mode: dropout dropped half the activations, so the "
                              "loss changes from one evaluation to the next", details)
    if saved[0]:
        return Verdict(False, f"the forward passes recorded a graph ({saved[0]} tensors kept for a backward that never "
                              "comes): evaluation needs no gradients", details)
    if not model.training:
        return Verdict(False, "the loss is right, but the model is still in eval mode afterwards: the next training "
                              "step would run without dropout", details)
    if math.isclose(result, mean_of_means, rel_tol=1e-6) and not math.isclose(result, reference, rel_tol=1e-6):
        return Verdict(False, f"that is the mean of the {len(batches)} batch means: the last batch holds "
                              f"{EVAL_SIZES[-1]} examples, the others {EVAL_SIZES[0]}, so its examples count "
                              f"{format_number(EVAL_SIZES[0] / EVAL_SIZES[-1])} times too much", details)
    if not math.isclose(result, reference, rel_tol=1e-5):
        return Verdict(False, f"evaluate gave {format_number(result, digits=6)}, the mean loss per held-out example is "
                              f"{format_number(reference, digits=6)}", details)
    return Verdict(True, "right: the mean loss per example, dropout off, no graph, the model back in training mode",
                   details)


# ---- training loop: a checkpoint that resumes exactly -------------------------------------------------

RESUME_STEPS = 3


def _resume_setup(seed: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 3))
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def _resume_train(model, optimizer, batches) -> None:
    from torch import nn

    for x, y in batches:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def check_checkpoint_resume(answer: str) -> Verdict:
    """save(model, optimizer) -> dict and load(model, optimizer, state): a run trained 3 steps, saved
    (written with torch.save and read back with torch.load, as a file is), must continue on fresh
    objects exactly as the uninterrupted run did: the same weights after 3 more steps of Adam with
    dropout. That needs the weights, the optimizer's state (Adam's moments and step count) and the
    random number generator's state (the dropout masks)."""
    import io

    import torch

    generator = torch.Generator().manual_seed(31)
    batches = [(torch.randn(16, 8, generator=generator), torch.randint(0, 3, (16,), generator=generator))
               for _ in range(2 * RESUME_STEPS)]
    try:
        code_globals = {"torch": torch}
        save = learner_function(answer, "save", given=code_globals)
        load = learner_function(answer, "load", given=code_globals)
        model, optimizer = _resume_setup(32)
        _resume_train(model, optimizer, batches[:RESUME_STEPS])
        state = call(save, model, optimizer)
        saved_weights = [p.detach().clone() for p in model.parameters()]
        buffer = io.BytesIO()
        try:
            torch.save(state, buffer)
            buffer.seek(0)
            restored = torch.load(buffer)  # weights_only: a checkpoint is data, not pickled objects
        except Exception as failure:
            return Verdict(False, f"your checkpoint cannot be written and read back as a file ({type(failure).__name__}): "
                                  "save state_dict()s, tensors and numbers, not the model or optimizer objects")
        _resume_train(model, optimizer, batches[RESUME_STEPS:])
        reference = [p.detach().clone() for p in model.parameters()]
        fresh_model, fresh_optimizer = _resume_setup(33)  # another start: the crash lost everything in memory
        call(load, fresh_model, fresh_optimizer, restored)
    except Refused as refused:
        return Verdict(False, str(refused))
    restored_error = max(float((p.detach() - s).abs().max())
                         for p, s in zip(fresh_model.parameters(), saved_weights, strict=True))
    if restored_error > 0:
        return Verdict(False, "after load the weights are not the saved ones: restore the model's state_dict")
    _resume_train(fresh_model, fresh_optimizer, batches[RESUME_STEPS:])
    error = max(float((p.detach() - r).abs().max()) for p, r in zip(fresh_model.parameters(), reference, strict=True))
    details = (f"largest weight difference after {RESUME_STEPS} resumed steps: {format_number(error, digits=2)}",)
    if error <= 1e-6:
        return Verdict(True, "right: the resumed run is the uninterrupted one, to the last bit the check can see", details)
    adam_steps = [int(s["step"]) for s in fresh_optimizer.state_dict()["state"].values() if "step" in s]
    if not adam_steps or max(adam_steps) != 2 * RESUME_STEPS:
        return Verdict(False, "the weights came back but the resumed run diverges: Adam restarted from zero moments and "
                              "step 0, so its first updates are not the ones the run would have made. Save and "
                              "restore the optimizer's state_dict", details)
    return Verdict(False, "weights and optimizer came back, but the resumed run still diverges: the dropout masks after "
                          "the resume are not the ones the run would have drawn. Save and restore the random number "
                          "generator's state too", details)


# ---- precision: FP32 master weights ---------------------------------------------------------------

MASTER_STEPS, MASTER_LR = 400, 0.01


def check_master_weights(answer: str) -> Verdict:
    """step(weights, master, grad, lr) -> (weights, master): an SGD update of BF16 weights that keeps
    an FP32 master copy (master is None at the first call): Micikevicius et al. 2018 (arXiv
    1710.03740, §3.1). 400 updates each far below half a BF16 step must add up, as they do in the
    master; updating the BF16 weights themselves loses every one of them."""
    import torch

    generator = torch.Generator().manual_seed(41)
    start = (torch.rand(256, generator=generator) * 1.5 + 0.5).to(torch.bfloat16)
    grads = [(torch.rand(256, generator=generator) * 1e-3 + 5e-4) for _ in range(MASTER_STEPS)]
    exact = start.float()
    for grad in grads:
        exact = exact - MASTER_LR * grad
    wanted = exact.to(torch.bfloat16).float()
    try:
        step = learner_function(answer, "step", given={"torch": torch})
        weights, master = start.clone(), None
        for grad in grads:
            result = call(step, weights, master, grad.clone(), MASTER_LR)
            if not isinstance(result, tuple) or len(result) != 2:
                return Verdict(False, "step must return two things: (weights, master)")
            weights, master = result
            if not isinstance(weights, torch.Tensor) or weights.dtype != torch.bfloat16 or weights.shape != start.shape:
                return Verdict(False, "the weights step returns must stay a BF16 tensor of the same shape: they are what "
                                      "the forward pass multiplies")
    except Refused as refused:
        return Verdict(False, str(refused))
    moved = float((start.float() - weights.float()).mean())
    should = float((start.float() - exact).mean())
    ulp = (wanted.abs() * 2.0**-7).clamp(min=2.0**-126)
    off = float(((weights.float() - wanted).abs() > ulp * 1.01).float().mean())
    details = (f"mean movement of the weights over {MASTER_STEPS} steps: {format_number(moved, digits=3)} "
               f"(the exact sum of the updates: {format_number(should, digits=3)})",
               f"weights more than one BF16 step from the exact result: {format_percent(off)}")
    if moved < 0.5 * should:
        return Verdict(False, f"the weights moved {format_percent(moved / should if should else 0.0)} of what the updates add up "
                              "to: each update is far below half a BF16 step at these magnitudes, so rounding to BF16 "
                              "after every step throws it away. Keep the sum where it survives", details)
    if off > 0.01:
        return Verdict(False, "the weights moved, but not to the BF16 value of the exact sum of the updates", details)
    return Verdict(True, "right: the updates add up in the FP32 master, and the BF16 weights follow it", details)


# ---- mixture of experts: a layer that runs each expert on its own tokens ---------------------------

MOE_TOKENS, MOE_WIDTH, MOE_EXPERTS, MOE_K = 24, 8, 6, 2


def check_moe_dispatch(answer: str) -> Verdict:
    """moe_forward(x, router_logits, experts, k) -> y: Mixtral's layer, y_t = Σ over the k experts of
    token t with the largest logits of softmax over those k logits × expert(x_t) (Jiang et al. 2024,
    arXiv 2401.04088, §2.1). Compared with a reference, and each expert must run on its own tokens
    only: k × tokens rows in all, not experts × tokens (the active parameters are the compute)."""
    import torch
    from torch import nn

    torch.manual_seed(51)
    layers = [nn.Linear(MOE_WIDTH, MOE_WIDTH) for _ in range(MOE_EXPERTS)]
    rows: list[int] = []

    def expert(layer):
        def run(inputs):
            rows.append(int(inputs.reshape(-1, MOE_WIDTH).shape[0]))
            return layer(inputs)
        return run

    experts = [expert(layer) for layer in layers]
    generator = torch.Generator().manual_seed(52)
    x = torch.randn(MOE_TOKENS, MOE_WIDTH, generator=generator)
    logits = torch.randn(MOE_TOKENS, MOE_EXPERTS, generator=generator) * 2
    with torch.no_grad():
        top, chosen = logits.topk(MOE_K, dim=-1)
        gates = torch.softmax(top, dim=-1)
        every = torch.stack([layer(x) for layer in layers], dim=1)  # tokens × experts × width
        picked = every.gather(1, chosen.unsqueeze(-1).expand(-1, -1, MOE_WIDTH))
        reference = (gates.unsqueeze(-1) * picked).sum(1)
        switch_gates = torch.softmax(logits, dim=-1).gather(1, chosen)
        unnormalised = (switch_gates.unsqueeze(-1) * picked).sum(1)
    try:
        moe_forward = learner_function(answer, "moe_forward", given={"torch": torch})
        with torch.no_grad():
            y = call(moe_forward, x.clone(), logits.clone(), experts, MOE_K)
    except Refused as refused:
        return Verdict(False, str(refused))
    ran = sum(rows)
    details = (f"rows the experts ran: {ran} (top-{MOE_K} of {MOE_TOKENS} tokens: {MOE_K * MOE_TOKENS}; every expert on "
               f"every token: {MOE_EXPERTS * MOE_TOKENS})",)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (MOE_TOKENS, MOE_WIDTH):
        return Verdict(False, f"moe_forward must return a tensor of tokens × width, {MOE_TOKENS} × {MOE_WIDTH}", details)
    error = float((y - reference).abs().max())
    if error > 1e-4:
        if float((y - unnormalised).abs().max()) < 1e-4:
            return Verdict(False, "those are the softmax over all experts' logits, kept for the k chosen: Mixtral takes the "
                                  "softmax over the k chosen logits only, so a token's weights sum to 1", details)
        return Verdict(False, f"the output is off by up to {format_number(error)}: each token is the weighted sum of its "
                              f"{MOE_K} chosen experts' outputs", details)
    if ran > MOE_K * MOE_TOKENS:
        return Verdict(False, f"the experts ran {ran} rows where {MOE_K * MOE_TOKENS} were needed: running every expert on "
                              "every token and masking costs the compute of a dense layer of all experts. Give each "
                              "expert only the tokens routed to it", details)
    return Verdict(True, f"right: Mixtral's output, and the experts ran {ran} rows, k / E of a dense layer of all experts",
                   details)
