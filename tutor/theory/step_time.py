"""How long a training step takes, and a whole training run; how fast a prefill and a decode step are.

Every operation of `tutor.theory.step_operations` is timed on given ceilings (measured on this
machine, or a datasheet peak times a published achieved fraction: `Ceilings` carries a source for
each), then composed:

- an operation's time is the roofline bound (Williams, Waterman, Patterson, CACM 2009):
  max(FLOPs / the matmul rate for its shape, bytes / the memory bandwidth), plus the launch cost of
  its kernels;
- a step is forward + backward of every micro-batch, the pipeline bubble (p-1)/m of that
  (Narayanan et al. arXiv 2104.04473 §2.2), the optimizer, and the communication left exposed;
- a collective costs the alpha-beta ring model, steps·α + S·factor / busbw (Thakur, Rabenseifner,
  Gropp, "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005; busbw and the
  factors as nccl-tests doc/PERFORMANCE.md defines them);
- overlap is an explicit assumption: `overlap` is the share of the data-parallel gradient traffic
  hidden under the backward pass, at most the backward's own length (PyTorch DDP all-reduces
  gradient buckets while the backward runs: Li et al., "PyTorch Distributed", VLDB 2020 §3.2.3);
  tensor-parallel all-reduces and expert all-to-alls sit on the critical path (Shoeybi et al.
  arXiv 1909.08053 §3) and are never hidden here;
- MFU is model FLOPs per second over the peak (PaLM, Chowdhery et al. arXiv 2204.02311 App. B).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field, replace

from tutor.errors import UserError
from tutor.theory.fit import FitRequest
from tutor.theory.models import Architecture, count_parameters
from tutor.theory.parallel import (
    DDP_BUCKET_BYTES,  # one all-reduce per bucket, so one latency term per bucket
    bus_bandwidth_factor,
    data_parallel_comm_bytes,
    expert_parallel_alltoall_bytes,
    pipeline_bubble_ratio,
    pipeline_p2p_bytes_per_microbatch,
    tensor_parallel_comm_bytes_per_layer,
)
from tutor.theory.memory import training_recipe
from tutor.theory.step_operations import (
    FRAMEWORK,
    SDPA_KERNEL,
    adapter_params_on_device,
    GEMM,
    Operation,
    PassShape,
    StepOperations,
    activation_bytes,
    backward_of,
    inference_operations,
    layer_forward,
    model_ends_forward,
    training_operations,
)



@dataclass(frozen=True)
class Sourced:
    """A figure and where it came from: a measured run (id and date) or a citation."""

    value: float
    unit: str
    source: str


@dataclass(frozen=True)
class GemmPoint:
    """A measured (or sourced) matmul rate at one shape: `batch` matrices of m×n×k."""

    m: int
    n: int
    k: int
    flops_per_s: float
    batch: int = 1

    @property
    def size(self) -> float:
        """The geometric-mean dimension (m·n·k)^(1/3): the shape class a rate is looked up by."""
        return (self.m * self.n * self.k) ** (1 / 3)


@dataclass(frozen=True)
class BandwidthPoint:
    """A measured memory bandwidth for operations touching `bytes` per call."""

    bytes: int
    bytes_per_s: float


@dataclass(frozen=True)
class HostCosts:
    """Seconds the host spends in the framework's own code (Python, dispatch, kernel launches) per call of a
    decoder layer and of the rest of the model, for a prefill and for a decode step at a few batches:
    measured on the device at near-zero work (the same family at width 64, 1 and 3 layers, per layer the
    difference), or an explicit assumption for a card by name. `rows`: (mode, name, batch, seconds) with
    mode "prefill" or "decode" and name LAYER_CODE or MODEL_CODE (tutor.theory.step_operations)."""

    rows: tuple[tuple[str, str, int, float], ...]
    source: str

    def seconds(self, mode: str, name: str, batch: int) -> float | None:
        """Per call at `batch`: linear between the measured batches (a mixture-of-experts layer runs one
        expert's code per expert its tokens touch, so its code grows with the batch), flat beyond them."""
        points = sorted((float(b), s) for m, n, b, s in self.rows if m == mode and n == name)
        return _linear(points, batch) if points else None


def _linear(points: list[tuple[float, float]], x: float) -> float:
    """y at x on the points (sorted by x): linear between them, flat beyond the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


@dataclass(frozen=True)
class Ceilings:
    """What a device can do, each figure with its source: the matmul curve over shapes, the memory
    bandwidth, the cost of a kernel launch, the links, and the datasheet peak for MFU."""

    device: str
    dtype: str
    gemm_points: tuple[GemmPoint, ...]
    gemm_source: str
    bandwidth_points: tuple[BandwidthPoint, ...]
    bandwidth_source: str
    peak_flops: Sourced | None = None
    kernel_overhead: Sourced = Sourced(0.0, "s", "not modelled")
    intra_node_link: Sourced | None = None   # busbw, B/s, within a node (NVLink, PCIe, shared memory)
    inter_node_link: Sourced | None = None   # busbw, B/s, between nodes (one NIC per device)
    link_latency: Sourced | None = None      # seconds per ring step (α)
    devices_per_node: int = 8
    notes: tuple[str, ...] = field(default=())
    # Rates measured for one operation of the step itself ("phase:name" -> bytes/s, launches included):
    # the memory-bound kernels' own ceilings at their own shapes (tutor.trace.step_verify).
    named_bandwidth: tuple[tuple[str, float], ...] = ()
    # Seconds per call of a framework operation ("phase:name"), measured at near-zero work.
    named_seconds: tuple[tuple[str, float], ...] = ()
    framework_source: str = "framework code not timed (no measurement at near-zero work)"
    clock_fraction: Sourced | None = None    # the clock now over the clock the datasheet peak assumes
    # The framework's own code per call on the host (Python, dispatch, launches), for an inference step's engines.
    host: HostCosts | None = None
    # True where the host queues kernels for another device (CUDA): an eager step takes the longer of the two.
    host_overlaps: bool = False
    # Seconds per kernel replayed from a CUDA graph (its floor, however little work it does): the graphs engine.
    graph_kernel: Sourced | None = None
    # Measured bandwidth of matrix-vector products, (rows m, bytes per call, bytes/s): a decode step's GEMMs on its
    # weights stream at it, by their row count and size.
    decode_matmul: tuple[tuple[int, int, float], ...] = ()
    decode_matmul_source: str = ""
    # Measured elements per second of the transcendental functions (step_operations.ELEMENTWISE_FUNCTIONS) on data in
    # the caches: an elementwise op takes the longer of its bytes and its functions' evaluation.
    elementwise_rates: tuple[tuple[str, float], ...] = ()
    elementwise_source: str = ""
    # Bytes per second of writing freshly mapped memory beyond writing memory already mapped (page faults, zeroing).
    first_touch: Sourced | None = None
    # Measured FLOP/s of the fused causal attention kernel (SDPA) by pass and sequence length: (phase, s, FLOP/s).
    attention_rates: tuple[tuple[str, int, float], ...] = ()
    attention_source: str = ""

    def attention_rate(self, op: Operation) -> float | None:
        """The fused attention kernel's FLOP/s for this op's pass at its sequence length (op.m, the queries):
        log-log between the measured lengths, flat beyond them; None where not measured."""
        points = sorted((float(seq), rate) for phase, seq, rate in self.attention_rates if phase == op.phase)
        if op.kernel != SDPA_KERNEL or not points:
            return None
        return _interpolate([s for s, _ in points], [r for _, r in points], op.m)

    def function_seconds(self, op: Operation) -> float:
        """One call's evaluation of the op's transcendental functions at their measured rates (0 where unmeasured)."""
        rates = dict(self.elementwise_rates)
        return sum(elements / rates[name] for name, elements in op.functions if rates.get(name))

    def fresh_seconds(self, op: Operation) -> float:
        """One call's first touch of the freshly mapped memory it writes (0 without a measured rate)."""
        return op.fresh_bytes / self.first_touch.value if op.fresh_bytes and self.first_touch is not None else 0.0

    def named_rate(self, op: Operation) -> float | None:
        """The measured rate of this very operation, when the ceilings hold one."""
        key = f"{op.phase}:{op.name}"
        return next((rate for name, rate in self.named_bandwidth if name == key), None)

    @property
    def max_matmul_flops(self) -> float:
        return max(point.flops_per_s for point in self.gemm_points)

    def sources(self) -> dict[str, str]:
        """Each figure's source, for the output's `sources` (a test checks none is missing)."""
        out = {"matmul": self.gemm_source, "memory_bandwidth": self.bandwidth_source,
               "kernel_overhead": self.kernel_overhead.source,
               **({"decode_matmul": self.decode_matmul_source} if self.decode_matmul else {}),
               **({"elementwise_functions": self.elementwise_source} if self.elementwise_rates else {}),
               **({"attention_kernel": self.attention_source} if self.attention_rates else {}),
               "framework": self.host.source if self.host is not None else self.framework_source}
        if self.peak_flops is not None:
            out["peak_flops"] = self.peak_flops.source
        for name in ("intra_node_link", "inter_node_link", "link_latency", "clock_fraction", "graph_kernel",
                     "first_touch"):
            figure = getattr(self, name)
            if figure is not None:
                out[name] = figure.source
        return out


def _interpolate(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear in log-log between measured points, flat beyond the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_left(xs, x)
    x0, x1, y0, y1 = math.log(xs[i - 1]), math.log(xs[i]), math.log(ys[i - 1]), math.log(ys[i])
    return math.exp(y0 + (y1 - y0) * (math.log(x) - x0) / (x1 - x0))


def exact_gemm_rate(ceilings: Ceilings, op: Operation) -> float | None:
    """The measured rate of this very GEMM shape (batch, m, n, k), when the ceilings hold it."""
    return next((p.flops_per_s for p in ceilings.gemm_points if (p.batch, p.m, p.n, p.k) == (op.batch, op.m, op.n, op.k)),
                None)


def gemm_rate(ceilings: Ceilings, op: Operation) -> float:
    """FLOP/s the device reaches on this GEMM: the measured rate of this very shape when the ceilings
    hold it, else the measured curve at its shape class ((m·n·k)^(1/3), log-log interpolation), never
    above the roofline's intensity × bandwidth (Williams et al. 2009)."""
    exact = exact_gemm_rate(ceilings, op)
    if exact is not None:
        return exact
    points = sorted(ceilings.gemm_points, key=lambda p: p.size)
    size = (op.m * op.n * op.k) ** (1 / 3)
    rate = _interpolate([p.size for p in points], [p.flops_per_s for p in points], size)
    if op.bytes and ceilings.bandwidth_points:
        intensity = op.flops / op.bytes
        skinny = decode_matmul_bandwidth(ceilings, op)
        rate = min(rate, intensity * (skinny if skinny is not None else memory_bandwidth(ceilings, op.bytes // op.batch)))
    return rate


SKINNY_ROWS = 16
"""A GEMM with at most this many rows on one weight matrix is a matrix-vector product as BLAS libraries treat it."""


def decode_matmul_bandwidth(ceilings: Ceilings, op: Operation) -> float | None:
    """The bandwidth a weight GEMM with few rows (a decode step's, m = batch) streams at, from the measured
    matrix-vector points: at each measured row count log-log in the bytes per call (flat beyond the ends), then
    linear in m between row counts (flat beyond); None for other GEMMs or without points."""
    if not ceilings.decode_matmul or op.batch != 1 or op.m > SKINNY_ROWS:
        return None
    by_rows: dict[int, list[tuple[int, float]]] = {}
    for m, nbytes, rate in ceilings.decode_matmul:
        by_rows.setdefault(m, []).append((nbytes, rate))
    curve: list[tuple[float, float]] = []
    for m, points in sorted(by_rows.items()):
        points.sort()
        curve.append((m, _interpolate([float(b) for b, _ in points], [r for _, r in points], max(1, op.bytes))))
    return _linear(curve, op.m)


def memory_bandwidth(ceilings: Ceilings, nbytes: int) -> float:
    """Bytes per second for an operation moving `nbytes` per call, from the measured points."""
    points = sorted(ceilings.bandwidth_points, key=lambda p: p.bytes)
    if not points:
        raise UserError("no memory bandwidth measured or sourced for this device")
    return _interpolate([p.bytes for p in points], [p.bytes_per_s for p in points], max(1, nbytes))


def operation_seconds(ceilings: Ceilings, op: Operation) -> float:
    """All calls of one operation: roofline time per call plus its kernel launches. An operation whose own
    rate was measured (a named memory-bound op, a GEMM at its exact shape) already includes its launches (and the
    first touch of what it writes). The roofline of an elementwise op has two roofs, its bytes at the bandwidth
    and its transcendental functions at their measured rates (Williams et al. 2009: the longer one bounds); memory
    it writes on freshly mapped pages adds its first touch (page faults and zeroing, which the kernel runs before
    the op can write: not overlapped)."""
    if op.kind == FRAMEWORK:
        key = f"{op.phase}:{op.name}"
        return op.calls * next((seconds for name, seconds in ceilings.named_seconds if name == key), 0.0)
    named = ceilings.named_rate(op) if op.kind != GEMM else None
    if named is not None:
        return op.calls * op.bytes / named
    exact = exact_gemm_rate(ceilings, op) if op.kind == GEMM else None
    if exact is not None:
        return op.calls * op.flops / exact
    fused = ceilings.attention_rate(op) if op.kind == GEMM else None
    if fused is not None:  # the fused kernel's own measured rate, its launches and blocking included
        return op.calls * (op.flops / fused + ceilings.fresh_seconds(op))
    skinny = decode_matmul_bandwidth(ceilings, op) if op.kind == GEMM else None
    per_call = op.bytes / (skinny if skinny is not None else memory_bandwidth(ceilings, op.bytes))
    if op.kind == GEMM:
        per_call = max(per_call, op.flops / gemm_rate(ceilings, op))
    elif op.functions:
        per_call = max(per_call, ceilings.function_seconds(op))
    per_call += ceilings.fresh_seconds(op)
    return op.calls * (per_call + op.kernels * ceilings.kernel_overhead.value)


def phase_seconds(ceilings: Ceilings, operations) -> dict[str, float]:
    """Seconds per phase (forward, backward, optimizer) of a set of operations."""
    out: dict[str, float] = {}
    for op in operations:
        out[op.phase] = out.get(op.phase, 0.0) + operation_seconds(ceilings, op)
    return out


# ----------------------------------------------------------------------------------------------
# Communication


@dataclass(frozen=True)
class Collective:
    """The traffic of one parallel dimension per step: which collective, over how many ranks, its
    bytes per rank, its time on the link, and how much of that time is exposed."""

    group: str          # "dp", "zero", "tp", "pp", "ep"
    op: str             # nccl-tests name
    ranks: int
    bytes_per_rank: int
    calls: int          # launches per step (each pays the latency steps)
    link: str           # "intra_node_link" or "inter_node_link"
    seconds: float
    exposed_seconds: float
    formula: str


def latency_steps(op: str, ranks: int) -> int:
    """Latency terms (α) of one collective over `ranks`, by the algorithm NCCL would pick: the ring's
    2(n-1) for all-reduce, (n-1) for reduce-scatter / all-gather / all-to-all, 1 for a point-to-point
    hand-over (Thakur, Rabenseifner & Gropp 2005, §4); for all-reduce, the tree's 2⌈log2 n⌉ when
    fewer: Rabenseifner's reduce-scatter + all-gather (ibid. §4.4) and NCCL's double binary trees
    (NCCL 2.4, Jeaugey 2019: logarithmic latency at full bandwidth) move the same bytes per rank as
    the ring, so only the latency term differs. A ring of 16,384 ranks would wait 32,766 steps per call."""
    if op == "send_recv":
        return 1
    if op == "all_reduce":
        return min(2 * (ranks - 1), 2 * math.ceil(math.log2(ranks)))
    return ranks - 1


def collective_seconds(op: str, bytes_per_rank: int, ranks: int, *, calls: int, busbw: float,
                       latency: float) -> float:
    """calls · latency_steps · α + bytes each rank moves / busbw (busbw counts exactly those bytes:
    nccl-tests doc/PERFORMANCE.md)."""
    if ranks <= 1 or bytes_per_rank <= 0:
        return 0.0
    return calls * latency_steps(op, ranks) * latency + bytes_per_rank / busbw


def _link(ceilings: Ceilings, name: str) -> tuple[float, float]:
    figure = getattr(ceilings, name)
    if figure is None:
        raise UserError(f"no {name.replace('_', ' ')} bandwidth known for {ceilings.device}: "
                        "measure one (tensor-tutor bench collective), or pass a card whose record holds one")
    latency = ceilings.link_latency.value if ceilings.link_latency is not None else 0.0
    return figure.value, latency


def step_communication(arch: Architecture, request: FitRequest, ceilings: Ceilings, *,
                       backward_seconds: float, overlap: float) -> tuple[Collective, ...]:
    """Every collective of one training step on one device, with its exposed time.

    Placement: a tensor-parallel group stays inside a node; the data-parallel, expert and pipeline
    groups leave the node once tp x dp (or tp x pp) exceeds the devices of one node."""
    if not 0 <= overlap <= 1:
        raise UserError(f"--overlap must be between 0 and 1, got {overlap}")
    params = count_parameters(arch).total
    per_device = math.ceil(params / (request.tp * request.pp))
    microbatches = request.microbatches or request.pp
    node = ceilings.devices_per_node
    out: list[Collective] = []
    e = activation_bytes(request)
    if request.dp > 1:
        grad_bytes = training_recipe(request.recipe).grad_bytes if request.recipe in ("mixed", "megatron", "hf-amp",
                                                                                       "bf16", "fp32") else 2
        if request.adapter:  # only the adapters have gradients to all-reduce
            per_device, grad_bytes = adapter_params_on_device(arch, request), e
        volume = data_parallel_comm_bytes(params=per_device, dp=request.dp, stage=request.zero,
                                          bytes_per_grad=grad_bytes)
        link = "intra_node_link" if request.tp * request.dp <= node else "inter_node_link"
        busbw, latency = _link(ceilings, link)
        buckets = max(1, math.ceil(per_device * grad_bytes / DDP_BUCKET_BYTES))
        bytes_per_rank = volume.bytes_per_rank
        if request.zero == 3:  # the parameter all-gathers repeat for every micro-batch
            bytes_per_rank = math.ceil(volume.bytes_per_rank * (2 * microbatches + 1) / 3)
        op = "all_reduce" if request.zero == 0 else ("reduce_scatter" if request.zero < 3 else "all_gather")
        seconds = collective_seconds(op if request.zero else "all_reduce", bytes_per_rank, request.dp,
                                     calls=buckets * len(volume.collectives), busbw=busbw, latency=latency)
        hidden = min(seconds * overlap, backward_seconds)
        out.append(Collective("zero" if request.zero else "dp", "+".join(volume.collectives), request.dp,
                              bytes_per_rank, buckets * len(volume.collectives), link, seconds, seconds - hidden,
                              f"ZeRO-{request.zero}: {' + '.join(volume.collectives)} of {per_device:,} gradients "
                              f"x {float(grad_bytes):g} B over dp={request.dp}; {overlap:.0%} of it hidden under "
                              "the backward pass at most"))
    if request.tp > 1:
        layers = math.ceil(arch.num_layers / request.pp)
        per_layer = tensor_parallel_comm_bytes_per_layer(seq_len=request.seq_len, batch=request.batch,
                                                         hidden=arch.hidden_size, tp=request.tp, bytes_per_value=e,
                                                         sequence_parallel=request.sequence_parallel)
        busbw, latency = _link(ceilings, "intra_node_link")
        calls = 4 * layers * microbatches
        total = per_layer * layers * microbatches
        seconds = collective_seconds("all_reduce", total, request.tp, calls=calls, busbw=busbw, latency=latency)
        out.append(Collective("tp", "all_reduce", request.tp, total, calls, "intra_node_link", seconds, seconds,
                              f"4 all-reduces of b·s·h = {request.batch}·{request.seq_len}·{arch.hidden_size} x {e} B "
                              f"per layer per micro-batch, {layers} layers x {microbatches} micro-batches"))
    if request.pp > 1:
        per_micro = pipeline_p2p_bytes_per_microbatch(request.seq_len, request.batch, arch.hidden_size, e)
        link = "intra_node_link" if request.tp * request.pp <= node else "inter_node_link"
        busbw, latency = _link(ceilings, link)
        one = collective_seconds("send_recv", per_micro // 2, 2, calls=1, busbw=busbw, latency=latency)
        seconds = 2 * one * microbatches
        exposed = 2 * one * (request.pp - 1)
        out.append(Collective("pp", "send_recv", request.pp, per_micro * microbatches, 2 * microbatches, link,
                              seconds, exposed,
                              "b·s·h activations forward and their gradient back per micro-batch; only the "
                              f"{request.pp - 1} hand-overs of the fill and the drain are exposed (1F1B)"))
    if request.ep > 1:
        moe_layers = math.ceil(arch.moe_layers / request.pp)
        tokens = request.batch * request.seq_len
        per_layer = expert_parallel_alltoall_bytes(tokens, arch.hidden_size, arch.experts_per_token, request.ep, e)
        link = "intra_node_link" if request.tp * request.ep <= node else "inter_node_link"
        busbw, latency = _link(ceilings, link)
        calls = 4 * moe_layers * microbatches
        total = 2 * per_layer * moe_layers * microbatches
        seconds = collective_seconds("all_to_all", total, request.ep, calls=calls, busbw=busbw, latency=latency)
        out.append(Collective("ep", "all_to_all", request.ep, total, calls, link, seconds, seconds,
                              "dispatch + combine all-to-all per MoE layer, forward and backward"))
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# The training step


@dataclass(frozen=True)
class StepTime:
    """One training step on one device: phases, what they came from, and the rates they imply."""

    seconds: float
    phases: dict[str, float]          # forward, backward, optimizer, pipeline_bubble, communication
    operations: StepOperations
    collectives: tuple[Collective, ...]
    tokens_per_step: int              # over all data-parallel ranks
    model_flops_per_step: float       # over all devices, without recomputation
    devices: int
    mfu_override: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.seconds

    def mfu(self, peak_flops_per_device: float) -> float:
        """Model FLOPs utilisation against `peak_flops_per_device` (PaLM App. B)."""
        return self.model_flops_per_step / (self.seconds * self.devices * peak_flops_per_device)


def model_flops_per_token(arch: Architecture, *, seq_len: int, attention: str = "sdpa") -> float:
    """Forward + backward FLOPs of one trained token, counted op by op on one device with no
    parallelism and no recomputation: the GEMMs of every layer, the attention as its kernel computes
    it (half the s×s when causal on a flash kernel) and the LM head. Kaplan's 6N plus attention,
    measured by what the code multiplies."""
    request = FitRequest(mode="train", batch=1, seq_len=seq_len, attention=attention)
    shape = PassShape(1, seq_len, seq_len)
    forward = []
    moe = arch.moe_layers
    for is_moe, count in ((False, arch.num_layers - moe), (True, moe)):
        if count:
            forward += layer_forward(arch, moe_layer=is_moe, shape=shape, tp=1, ep=1, e=2, attention=attention,
                                     calls=count, training=True)
    forward += model_ends_forward(arch, shape=shape, tp=1, e=2, calls=1, first=True, last=True, loss=True)
    backward = backward_of(forward, request.attention)
    return sum(op.total_flops for op in forward + backward) / seq_len


def adapter_model_flops_per_token(arch: Architecture, request: FitRequest) -> float:
    """Forward + backward FLOPs of one token of a LoRA/QLoRA step, counted op by op on one device without
    recomputation: the frozen base's forward and dX, the adapters' forward, dX and dW (no base dW: the
    2N that full training spends on weight gradients is not work a frozen base needs)."""
    single = replace(request, batch=1, dp=1, tp=1, pp=1, ep=1, zero=0, recompute="none", microbatches=None)
    ops = training_operations(arch, single, params_on_device=1)
    return sum(op.total_flops for op in ops.operations if op.phase != "optimizer") / request.seq_len


def training_step_time(arch: Architecture, request: FitRequest, ceilings: Ceilings, *, overlap: float = 1.0,
                       mfu: float | None = None, fused_optimizer: bool = False) -> StepTime:
    """The time of one training step of `request` on `ceilings`, phase by phase.

    With `mfu` given (a stated utilisation, e.g. the Llama 3 paper's 38%), the step is instead the
    model FLOPs over mfu × peak × devices, and the counted phases are scaled to that total."""
    params = count_parameters(arch).total
    per_device = math.ceil(params / (request.tp * request.pp))
    ops = training_operations(arch, request, params_on_device=per_device, fused_optimizer=fused_optimizer)
    phases = phase_seconds(ceilings, ops.operations)
    forward, backward = phases.get("forward", 0.0), phases.get("backward", 0.0)
    microbatches = ops.microbatches
    bubble = float(pipeline_bubble_ratio(stages=request.pp, microbatches=microbatches)) * (forward + backward)
    collectives = step_communication(arch, request, ceilings, backward_seconds=backward, overlap=overlap)
    out = {"forward": forward, "backward": backward, "optimizer": phases.get("optimizer", 0.0),
           "pipeline_bubble": bubble, "communication": sum(c.exposed_seconds for c in collectives)}
    tokens = request.batch * request.seq_len * microbatches * request.dp
    if request.adapter:
        model_flops = adapter_model_flops_per_token(arch, request) * tokens
    else:
        model_flops = model_flops_per_token(arch, seq_len=request.seq_len, attention=request.attention) * tokens
    total = sum(out.values())
    if mfu is not None:
        if not 0 < mfu <= 1:
            raise UserError(f"--mfu must be a fraction between 0 and 1 (e.g. 0.38), got {mfu}")
        if ceilings.peak_flops is None:
            raise UserError("--mfu needs a datasheet peak: pass --device with a card name (e.g. h100)")
        stated = model_flops / (mfu * ceilings.peak_flops.value * request.devices)
        out = {name: value * stated / total for name, value in out.items()} if total else out
        total = stated
    return StepTime(total, out, ops, collectives, tokens, model_flops, request.devices, mfu)


@dataclass(frozen=True)
class TrainingRun:
    """A whole run: tokens, model FLOPs, wall-clock seconds, device-hours and their cost."""

    tokens: int
    flops: float
    seconds: float
    device_hours: float
    cost: float | None


def training_run(step: StepTime, *, tokens: int, price_per_device_hour: float | None = None) -> TrainingRun:
    """Time to train on `tokens`: tokens / (tokens per second); device-hours = seconds × devices / 3600
    (the unit the Llama 3.1 model card reports: 30.84M H100-hours for 405B); cost = device-hours × price."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise UserError(f"--tokens must be a whole number of at least 1, got {tokens!r}")
    if price_per_device_hour is not None and not (price_per_device_hour >= 0 and math.isfinite(price_per_device_hour)):
        raise UserError(f"--price must be a number >= 0, got {price_per_device_hour}")
    seconds = tokens / step.tokens_per_second
    hours = seconds * step.devices / 3600
    flops = step.model_flops_per_step / step.tokens_per_step * tokens
    return TrainingRun(tokens, flops, seconds, hours, None if price_per_device_hour is None else hours * price_per_device_hour)


# ----------------------------------------------------------------------------------------------
# Inference


EAGER = "eager"
GRAPHS = "graphs"
ENGINE_WORDS = {EAGER: "transformers' forward as generate runs it, op by op from Python",
                GRAPHS: "the step captured once in a CUDA graph and replayed, as vLLM and SGLang run decode"}


@dataclass(frozen=True)
class EngineStep:
    """One inference pass (a prefill or one decode step) as an engine runs it: its time, the device's work
    and the host's (None where the host's code was not measured), the compute and memory roofs, and what
    bounds it: "compute" or "memory" (the device), or "host" (the framework's code on the CPU)."""

    engine: str
    seconds: float
    device_seconds: float
    host_seconds: float | None
    compute_seconds: float
    memory_seconds: float
    bound: str
    source: str


def _host_seconds(ceilings: Ceilings, ops, *, mode: str, batch: int) -> float | None:
    """The framework's own code in `ops` (FRAMEWORK operations): a per-call figure measured for this very step
    (Ceilings.named_seconds, time --verify) or the host's costs (Ceilings.host); None when neither holds one."""
    total, known = 0.0, False
    for op in ops:
        if op.kind != FRAMEWORK:
            continue
        named = next((s for name, s in ceilings.named_seconds if name == f"{op.phase}:{op.name}"), None)
        per_call = named if named is not None else (
            ceilings.host.seconds(mode, op.name, batch) if ceilings.host is not None else None)
        if per_call is not None:
            total += op.calls * per_call
            known = True
    return total if known else None


def _graph_kernel_seconds(ceilings: Ceilings, op: Operation, floor: float) -> float:
    """One operation replayed from a CUDA graph: no launch from the host, but no kernel shorter than the
    graph's per-kernel floor."""
    per_call = operation_seconds(replace(ceilings, kernel_overhead=Sourced(0.0, "s", "")), op) / op.calls
    return op.calls * max(per_call, op.kernels * floor)


def engine_steps(ceilings: Ceilings, ops, *, mode: str, batch: int) -> tuple[EngineStep, ...]:
    """The pass under each engine this device runs.

    - eager: the framework launches kernel by kernel from Python. On a CPU host and device are the same
      cores, so the step is the device's work plus the host's code; on a GPU the host queues kernels ahead
      of the device, so the step is the longer of the two (host-bound when the kernels are short: batch-1
      decode of an 8B model in transformers is about 15x its bandwidth floor on an H200, measured).
    - graphs (GPU only, Ceilings.graph_kernel): the step captured once and replayed (CUDA graphs; vLLM and
      SGLang capture their decode steps): the device's work with no host code, each kernel at least the
      graph's per-kernel floor (NVIDIA, "Getting Started with CUDA Graphs", 2019)."""
    device_ops = [op for op in ops if op.kind != FRAMEWORK]
    _, compute, memory = _roofs(ceilings, device_ops)
    device = sum(operation_seconds(ceilings, op) for op in device_ops)
    roof = "compute" if compute >= memory else "memory"
    host = _host_seconds(ceilings, ops, mode=mode, batch=batch)
    if host is None:
        eager = EngineStep(EAGER, device, device, None, compute, memory, roof,
                           "the device's work only: " + ceilings.framework_source)
    elif ceilings.host_overlaps:
        eager = EngineStep(EAGER, max(device, host), device, host, compute, memory, "host" if host > device else roof,
                           "the longer of the device's work and the host's code (it queues kernels ahead)")
    else:
        eager = EngineStep(EAGER, device + host, device, host, compute, memory, "host" if host > device else roof,
                           "the device's work plus the host's code (the same cores run both)")
    steps = [eager]
    if ceilings.graph_kernel is not None:
        floor = ceilings.graph_kernel.value
        graphs = sum(_graph_kernel_seconds(ceilings, op, floor) for op in device_ops)
        steps.append(EngineStep(GRAPHS, graphs, graphs, 0.0, compute, memory, roof,
                                f"the device's work, each kernel at least {floor * 1e6:.3g} µs: "
                                + ceilings.graph_kernel.source))
    return tuple(steps)


@dataclass(frozen=True)
class DecodePoint:
    """One decode step at a batch, as the eager engine runs it: its time, tokens per second, and which roof
    bounds the device's work (`engines`: the step under every engine the device runs)."""

    batch: int
    seconds: float
    tokens_per_second: float
    compute_seconds: float
    memory_seconds: float
    engines: tuple[EngineStep, ...] = ()

    @property
    def bound(self) -> str:
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"


def prefill_engines(arch: Architecture, request: FitRequest, ceilings: Ceilings) -> tuple[EngineStep, ...]:
    """Time to first token under each engine: the forward pass over the whole prompt (batch × seq_len),
    logits of the last position only (transformers generate)."""
    ops = inference_operations(arch, request, queries=request.seq_len, context=request.seq_len,
                               logits_tokens=request.batch)
    return engine_steps(ceilings, ops, mode="prefill", batch=request.batch)


def prefill_seconds(arch: Architecture, request: FitRequest, ceilings: Ceilings) -> float:
    """Time to first token as the eager engine runs it (compute-bound on the device for a long prompt; bound by the
    host's code on a GPU for a short one)."""
    return prefill_engines(arch, request, ceilings)[0].seconds


def _roofs(ceilings: Ceilings, ops) -> tuple[float, float, float]:
    """(time, compute roof, memory roof) of a set of operations: the time as operation_seconds gives it
    (a measured rate where the ceilings hold one), the roofs from the FLOPs at the matmul curve and the
    bytes at the bandwidth curve, which say which one bounds the step."""
    compute = memory = total = 0.0
    for op in ops:
        total += operation_seconds(ceilings, op)
        memory += op.calls * op.bytes / memory_bandwidth(ceilings, op.bytes)
        if op.kind == GEMM:
            compute += op.calls * op.flops / _curve_rate(ceilings, op)
    return total, compute, memory


def _curve_rate(ceilings: Ceilings, op: Operation) -> float:
    points = sorted(ceilings.gemm_points, key=lambda p: p.size)
    return _interpolate([p.size for p in points], [p.flops_per_s for p in points], (op.m * op.n * op.k) ** (1 / 3))


def decode_step(arch: Architecture, request: FitRequest, ceilings: Ceilings, *, batch: int,
                context: int) -> DecodePoint:
    """One decode step for `batch` sequences with `context` tokens cached: every weight and the whole
    KV cache read once (Pope et al. arXiv 2211.05102 §2.1), each op at its roofline bound, under each engine."""
    ops = inference_operations(arch, replace(request, batch=batch), queries=1, context=context)
    engines = engine_steps(ceilings, ops, mode="decode", batch=batch)
    eager = engines[0]
    return DecodePoint(batch, eager.seconds, batch / eager.seconds, eager.compute_seconds, eager.memory_seconds,
                       engines)


def decode_compute_bound_batch(arch: Architecture, request: FitRequest, ceilings: Ceilings, *, context: int,
                               limit: int = 1 << 20) -> int | None:
    """The smallest batch at which a decode step's compute time reaches its memory time (the ridge,
    Williams et al. 2009), or None when it never does below `limit` (the KV cache grows as fast as
    the FLOPs: long contexts stay memory-bound)."""
    def compute_bound(b: int) -> bool:
        point = decode_step(arch, request, ceilings, batch=b, context=context)
        return point.compute_seconds >= point.memory_seconds

    if compute_bound(1):
        return 1
    high = 2
    while not compute_bound(high):
        high *= 2
        if high > limit:
            return None
    low = high // 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if compute_bound(mid) else (mid, high)
    return high
