"""Convenience ops: dispatch, then launch. ``gemm(x, w)`` and ``gemm_fp8(x, w, scale_a, scale_b)``
compute y = x @ w.T (nn.Linear layout: x is (M, K), w is (N, K)).

The block-scaled fp8 op (vLLM's w8a8 block-fp8 linear, op ``fp8_blockscale``):
``gemm_fp8_blockscale(x, w, x_scale, w_scale)`` computes y = (x * x_scale) @ (w * w_scale).T
in bf16, with per-token 128-wide K group scales x_scale (M, ceil(K/128)) and 128x128
block scales w_scale (ceil(N/128), ceil(K/128)); ``quantize_fp8_per_token_group(x)``
makes (x, x_scale) from a bf16/fp16/fp32 activation.

All are torch custom ops (``torch.ops.gemm_costmodel.gemm`` / ``gemm_fp8`` /
``gemm_fp8_blockscale`` / ``quantize_fp8_per_token_group``) with fake implementations,
so they trace under torch.compile and replay inside CUDA graphs: the decision is made
on the host from the shapes alone, never by reading the GPU. Each op has its own
dispatcher (``set_dispatcher(d)`` sets the one of ``d.op``).

Unsure mode (opt-in, ``enable_unsure_mode``): the first call of a new shape
benchmarks the model's top k candidates on the GPU, keeps the fastest, and
persists the winner with provenance to a JSON file that later processes load as
a tuned table. Cost: about k x (compile ~0.4 s when not cached + ~30 ms timing)
on the first call per shape; none afterwards. Never benchmarks during CUDA-graph
capture (the model's choice is used there). It serves the dense ops, the
block-scaled fp8 GEMM and the MoE layer alike: the top k are checked against
the model's first choice on the call's operands, then timed as the dataset was
timed, in CUDA graphs over rotating synthetic copies of the problem (an MoE
stage's for the routing the caller names; an exact vLLM-table hit still wins
first). A problem whose timing copies do not fit in device memory keeps the
model's choice.
"""
from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timezone
from typing import Callable

import torch

from gemm_costmodel import registry
from gemm_costmodel.serving.runtime import Dispatcher, default_dispatcher

# The dense GEMM op: its space and (torch, triton) implementation, from the registry.
GEMM_OP_NAME = "gemm"
_OP = registry.get(GEMM_OP_NAME)
K = _OP.impl_module()
# The block-scaled fp8 op (vLLM's w8a8 block-fp8 linear).
BS_OP_NAME = "fp8_blockscale"
_BS_OP = registry.get(BS_OP_NAME)
BS = _BS_OP.impl_module()

# One dispatcher per op: set ones (set_dispatcher) and lazily made defaults for the current GPU.
_dispatchers: dict[str, Dispatcher] = {}
_default_dispatchers: dict[str, Dispatcher] = {}
_default_lock = threading.Lock()
# Config objects by (op, id): the ops share ids such as "cublas" with different meanings.
_configs: dict[tuple[str, str], object] = {}
_unsure: "UnsureTuner | None" = None


def set_dispatcher(d: Dispatcher | None, op: str | None = None) -> None:
    """Use ``d`` for the ops of ``op`` (default: ``d.op``; the dense ``gemm`` when ``d`` is None).
    None goes back to the process-wide default for the current GPU. ValueError if ``d`` serves
    another op than ``op`` or ``op`` is unknown."""
    # A dispatcher-like object without .op (a test double, older code) serves the dense op.
    d_op = getattr(d, "op", GEMM_OP_NAME) if d is not None else None
    if op is None:
        op = d_op or GEMM_OP_NAME
    registry.get(op)  # ValueError naming the known ops
    if d is None:
        _dispatchers.pop(op, None)
        return
    if d_op != op:
        raise ValueError(f"the dispatcher serves op {d_op!r}, not {op!r}")
    _dispatchers[op] = d


def dispatcher(op: str) -> Dispatcher:
    """The dispatcher the ops of ``op`` use."""
    d = _dispatchers.get(op)
    if d is not None:
        return d
    if op == GEMM_OP_NAME:  # the process-wide default dispatcher serves the dense op
        return default_dispatcher()
    d = _default_dispatchers.get(op)
    if d is None:
        with _default_lock:
            d = _default_dispatchers.get(op)
            if d is None:
                registry.get(op)
                d = _default_dispatchers[op] = Dispatcher(op=op)
    return d


def _config(cid: str, op: str):
    cfg = _configs.get((op, cid))
    if cfg is None:
        cfg = _configs[(op, cid)] = registry.get(op).config_from_id(cid)
    return cfg


def choose(x: torch.Tensor, w: torch.Tensor, scale_a=None, scale_b=None) -> str:
    """The config id the ops would launch for these operands (validates them)."""
    name = K.check_operands(x, w, scale_a, scale_b)
    m, k = x.shape
    n = w.shape[0]
    if _unsure is not None:
        return _unsure.choose(x, w, scale_a, scale_b, name)
    return dispatcher(GEMM_OP_NAME).select(m, n, k, name).candidate


def _run(x, w, scale_a=None, scale_b=None) -> torch.Tensor:
    return K.launch(_config(choose(x, w, scale_a, scale_b), GEMM_OP_NAME), x, w, None, scale_a, scale_b)


@torch.library.custom_op("gemm_costmodel::gemm", mutates_args=())
def _gemm_op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _run(x, w)


@_gemm_op.register_fake
def _(x, w):
    return x.new_empty((x.shape[0], w.shape[0]))


def _run_fp8(x, w, scale_a, scale_b) -> torch.Tensor:
    # The launchers apply scale_a and scale_b only to fp8 operands (launch_args): bf16/fp16 ones
    # would come back unscaled, a silently wrong y (issue 57, row 4), so they are refused here.
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float8_e4m3fn:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be float8_e4m3fn for gemm_fp8 (its scales apply to fp8 operands only), got {got}; "
                         "use gemm for bf16/fp16 operands")
    return _run(x, w, scale_a, scale_b)


@torch.library.custom_op("gemm_costmodel::gemm_fp8", mutates_args=())
def _gemm_fp8_op(x: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    return _run_fp8(x, w, scale_a, scale_b)


@_gemm_fp8_op.register_fake
def _(x, w, scale_a, scale_b):
    return x.new_empty((x.shape[0], w.shape[0]), dtype=torch.bfloat16)


# Eager calls skip the custom-op dispatcher: it costs ~20 us of host time per call on
# launch-bound shapes (measured on the H100 host), while tracing (torch.compile) needs
# the registered op. Both paths run the same decision and launch.

def gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y = x @ w.T for bf16/fp16 x (M, K) and w (N, K), on the dispatched kernel."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.gemm(x, w)
    return _run(x, w)


def gemm_fp8(x: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    """y = (x @ w.T) * scale_a * scale_b in bf16, for fp8 e4m3 x (M, K), w (N, K) and fp32 scalar scales."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.gemm_fp8(x, w, scale_a, scale_b)
    return _run_fp8(x, w, scale_a, scale_b)


# -- block-scaled fp8 (op fp8_blockscale) -----------------------------------------------

# The dtype the dispatcher decides for, by operand dtype. fp16/fp32 operands (same scale
# layout) exist for the Triton CPU interpreter, which computes garbage for fp8 dots; the
# dispatcher serves bf16/fp16/fp8, so fp32 is decided as fp16. The interpreter has no
# shared-memory limit, and nothing serves fp32 on a GPU.
_BS_DISPATCH_DTYPE = {"fp8": "fp8", "fp16": "fp16", "fp32": "fp16"}
# The op's argument names, in impl.check_operands' order (a, b, as_, bs).
_BS_ARGS = ("x", "w", "x_scale", "w_scale")


def _check_blockscale(x, w, x_scale, w_scale) -> str:
    """ValueError naming the bad argument (x, w, x_scale, w_scale); returns the dtype name.

    The same conditions as impl.check_operands (what the kernels accept), with messages in
    the op's argument names; run once per call (the eager path validates on every call)."""
    for label, t in zip(_BS_ARGS, (x, w, x_scale, w_scale)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{label} must be a torch tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{label} must be 2-D, got {t.dim()}-D (shape {tuple(t.shape)})")
        if not t.is_contiguous():
            raise ValueError(f"{label} must be contiguous (row-major)")
        if t.device != x.device:
            raise ValueError(f"{label} is on {t.device}, x on {x.device}: all operands must be on one device")
    if x.dtype not in BS.DTYPE_NAMES:
        raise ValueError(f"x must be float8_e4m3fn (fp16/fp32 for the CPU interpreter), got {x.dtype}")
    if w.dtype != x.dtype:
        raise ValueError(f"w must have x's dtype {x.dtype}, got {w.dtype}")
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"w must be (N, K) with x's K = {x.shape[1]}, got shape {tuple(w.shape)}")
    m, k = x.shape
    n = w.shape[0]
    if m < 1 or n < 1 or k < 1:
        raise ValueError(f"M, N and K must be >= 1, got x {tuple(x.shape)}, w {tuple(w.shape)}")
    want_x, want_w = BS.scale_shapes(m, n, k)
    for label, s, want, form in (("x_scale", x_scale, want_x, "(M, ceil(K/128))"),
                                 ("w_scale", w_scale, want_w, "(ceil(N/128), ceil(K/128))")):
        if s.dtype != torch.float32:
            raise ValueError(f"{label} must be float32, got {s.dtype}")
        if tuple(s.shape) != want:
            raise ValueError(f"{label} must have shape {form} = {want} (128-wide groups), got {tuple(s.shape)}")
    return BS.DTYPE_NAMES[x.dtype]


def choose_fp8_blockscale(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor) -> str:
    """The config id ``gemm_fp8_blockscale`` would launch for these operands (validates them)."""
    name = _check_blockscale(x, w, x_scale, w_scale)
    if _unsure is not None:
        return _unsure.choose_blockscale(x, w, x_scale, w_scale, name)
    m, k = x.shape
    return dispatcher(BS_OP_NAME).select(m, w.shape[0], k, _BS_DISPATCH_DTYPE[name]).candidate


def _run_blockscale(x, w, x_scale, w_scale) -> torch.Tensor:
    cfg = _config(choose_fp8_blockscale(x, w, x_scale, w_scale), BS_OP_NAME)
    return BS.launch(cfg, x, w, x_scale, w_scale)


@torch.library.custom_op("gemm_costmodel::gemm_fp8_blockscale", mutates_args=())
def _gemm_fp8_blockscale_op(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                            w_scale: torch.Tensor) -> torch.Tensor:
    return _run_blockscale(x, w, x_scale, w_scale)


@_gemm_fp8_blockscale_op.register_fake
def _(x, w, x_scale, w_scale):
    # Shapes and dtypes only: comparing symbolic sizes here would add guards (or specialise
    # dynamic shapes); the real op validates everything on its first call.
    for label, t in zip(_BS_ARGS, (x, w, x_scale, w_scale)):
        if t.dim() != 2:
            raise ValueError(f"{label} must be 2-D, got {t.dim()}-D (shape {tuple(t.shape)})")
    if x.dtype not in BS.DTYPE_NAMES:
        raise ValueError(f"x must be float8_e4m3fn (fp16/fp32 for the CPU interpreter), got {x.dtype}")
    return x.new_empty((x.shape[0], w.shape[0]), dtype=BS.OUT_TORCH_DTYPES[BS.DTYPE_NAMES[x.dtype]])


def _check_quantize(x, group) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K), got {x.dim()}-D (shape {tuple(x.shape)})")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    if type(group) is not int or group < 1:
        raise ValueError(f"group must be an int >= 1, got {group!r}")


def _quantize(x, group):
    _check_quantize(x, group)
    if x.shape[0] == 0 or x.shape[1] == 0:  # impl's group reshape needs elements; no groups to scale
        return (x.new_empty(x.shape, dtype=torch.float8_e4m3fn),
                x.new_zeros((x.shape[0], -(-x.shape[1] // group)), dtype=torch.float32))
    return BS.quantize_per_token_group(x, group, torch.float8_e4m3fn)


@torch.library.custom_op("gemm_costmodel::quantize_fp8_per_token_group", mutates_args=())
def _quantize_op(x: torch.Tensor, group: int = BS.GROUP_K) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize(x, group)


@_quantize_op.register_fake
def _(x, group=BS.GROUP_K):
    _check_quantize(x, group)
    m, k = x.shape
    return x.new_empty((m, k), dtype=torch.float8_e4m3fn), x.new_empty((m, -(-k // group)), dtype=torch.float32)


def gemm_fp8_blockscale(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """y (M, N) = (x * x_scale) @ (w * w_scale).T on the dispatched kernel (vLLM's w8a8 block-fp8 linear).

    x: float8_e4m3fn (M, K) activations; x_scale: float32 (M, ceil(K/128)), one scale per token
    per 128-wide K group (``quantize_fp8_per_token_group(x_bf16)`` makes both); w: float8_e4m3fn
    (N, K); w_scale: float32 (ceil(N/128), ceil(K/128)), one per 128x128 weight block. Returns
    bf16 (for fp16/fp32 operands, the CPU interpreter's stand-ins: the input dtype). Any M >= 1;
    N and K need not be multiples of 128. ValueError naming the bad argument."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.gemm_fp8_blockscale(x, w, x_scale, w_scale)
    return _run_blockscale(x, w, x_scale, w_scale)


def quantize_fp8_per_token_group(x: torch.Tensor, group: int = BS.GROUP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_q, x_scale): x (M, K) bf16/fp16/fp32 -> float8_e4m3fn (M, K) and float32 (M, ceil(K/group)),
    with x ~= x_q * x_scale repeated over each group of ``group`` columns; each group's largest |x|
    maps to 448 (an all-zero group gets a tiny positive scale and zeros, never NaN).
    ``gemm_fp8_blockscale`` needs group = 128 (its x_scale is per 128 columns); other groups are
    for other consumers."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.quantize_fp8_per_token_group(x, group)
    return _quantize(x, group)


# -- unsure mode -----------------------------------------------------------------------

def _graph_timer(op_name: str, problem):
    """(time_of(config id) -> ms, release()) for one problem of an op (a dense GEMM, a block-scaled
    GEMM, an MoE stage), timed as the harness times it: its CUDA-graph timer over rotating
    synthetic operand copies (``kernels.timing.timing_copies``: >= 2x L2 of what a launch reads, so
    weights come from HBM as in serving; the user's tensors are not copied). Measured on an H100:
    eager ``triton.testing.do_bench`` read the MoE decode stages at 1.1-20x their graph time
    (median 1.9x: the host's launch path, not the kernel) and its top-k picks were no better than
    the model's (benchmarks/explore/moe_unsure_check.py); on 30 dense shapes it read 1.23x the
    graph time and picked a config 1.107x off the graph timer's best on one of them
    (benchmarks/explore/unsure_timer_check.py)."""
    from gemm_costmodel.kernels.timing import GraphTimer, free_device_memory, timing_copies

    impl = registry.get(op_name).impl_module()
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(0)
    first = impl.make_operands(problem, dev, gen)
    sets = timing_copies(impl, problem, first, gen, torch.cuda.get_device_properties(dev).L2_cache_size, dev)
    timer = GraphTimer()

    def time_of(cid: str) -> float:
        cfg = _config(cid, op_name)
        return timer.measure(lambda i: sets[i].run(cfg), len(sets), key=cid).p50_us / 1e3

    def release() -> None:
        sets.clear()
        free_device_memory(timer, str(dev))

    return time_of, release


def _rel_diff(y: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()


class UnsureTuner:
    """Benchmark the model's top k on first sight of a shape; cache and persist the winner.

    The dense ops key a shape as ``<dtype>:<M>x<N>x<K>`` (the tuned-table format, so the file is a
    Dispatcher tuned table); the block-scaled GEMM keys it the same way under the file's
    ``"ops": {"fp8_blockscale": ...}`` and the MoE layer each stage as
    ``<dtype>:<stage>:<M>x<N>x<K>:e<E>k<top_k>`` under ``"ops": {"moe": ...}``; Dispatcher tuned
    tables ignore ``"ops"`` (they hold dense shapes only)."""

    def __init__(self, d: Dispatcher, k: int = 8, cache_file: str | None = None,
                 bench: Callable[[Callable[[], object]], float] | None = None,
                 moe_bench: Callable[[Callable[[], object]], float] | None = None,
                 blockscale_bench: Callable[[Callable[[], object]], float] | None = None):
        if type(k) is not int or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        self.d, self.k, self.cache_file = d, k, cache_file
        # An injected bench (tests) times every op unless an op's own is given too; by default
        # every op is timed by _graph_timer (CUDA graphs over rotating synthetic copies).
        self.bench = bench
        self.moe_bench = moe_bench or bench
        self.blockscale_bench = blockscale_bench or bench
        self.entries: dict[str, dict] = {}
        self.op_entries: dict[str, dict[str, dict]] = {MOE_OP_NAME: {}, BS_OP_NAME: {}}
        self._lock = threading.Lock()
        if cache_file and os.path.isfile(cache_file):
            with open(cache_file, encoding="utf-8") as fh:
                body = json.load(fh)
            self.entries = dict(body.get("entries", {}))
            for op, ent in dict(body.get("ops", {})).items():
                self.op_entries.setdefault(op, {}).update(ent)
        self._winners = {key: e["candidate"] for key, e in self.entries.items()}
        self._op_winners = {op: {key: e["candidate"] for key, e in ent.items()} for op, ent in self.op_entries.items()}

    def _pick(self, ranked: list[str], run: Callable[[str], torch.Tensor], time_of: Callable[[str], float],
              agree: Callable[[torch.Tensor, torch.Tensor], bool]):
        """(winner, its ms or None, {candidate: ms}) among ``ranked`` (the model's order): a
        candidate whose output ``run(cid)`` does not ``agree(y, ref)`` with the model's first choice's
        scores inf; so does one that fails to run or to be timed (``time_of(cid)``, ms). Without a
        finite time the model's first choice wins."""
        ref = None
        times: dict[str, float] = {}
        for cid in ranked:
            try:
                y = run(cid)
                if ref is None:
                    ref = y.float()
                elif not agree(y, ref):
                    times[cid] = float("inf")  # disagrees with the model's first choice: never pick it
                    continue
                times[cid] = time_of(cid)
            except Exception:  # noqa: BLE001 - a candidate that fails to run is skipped, not fatal
                times[cid] = float("inf")
        finite = {c: t for c, t in times.items() if t < float("inf")}
        winner = min(finite, key=finite.get) if finite else ranked[0]
        return winner, finite.get(winner), times

    def _timed_pick(self, op_name: str, problem, ranked: list[str], run, agree, bench):
        """``_pick`` timed by ``bench(fn) -> ms`` when given, else by ``_graph_timer`` over
        synthetic copies of ``problem``; without CUDA, or without device memory for those copies,
        the model's first choice wins untimed."""
        if bench is not None:
            return self._pick(ranked, run, lambda cid: bench(lambda: run(cid)), agree)
        if not torch.cuda.is_available():  # the CPU interpreter: no graph timer to time with
            return ranked[0], None, {}
        try:
            time_of, release = _graph_timer(op_name, problem)
        except torch.OutOfMemoryError:
            return ranked[0], None, {}
        try:
            return self._pick(ranked, run, time_of, agree)
        finally:
            release()

    def choose(self, x, w, scale_a, scale_b, dtype: str) -> str:
        m, k = x.shape
        n = w.shape[0]
        key = f"{dtype}:{m}x{n}x{k}"
        hit = self._winners.get(key)
        if hit is not None:
            return hit
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return self.d.select(m, n, k, dtype).candidate
        ranked = [c.candidate for c in self.d.rank(m, n, k, dtype, count=self.k)]

        def run(cid):
            return K.launch(_config(cid, GEMM_OP_NAME), x, w, None, scale_a, scale_b)

        winner, ms, times = self._timed_pick(_OP.name, _OP.space_module().Problem(m, n, k, dtype), ranked, run,
                                             lambda y, ref: torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-2),
                                             self.bench)
        with self._lock:
            self._winners[key] = winner
            self.entries[key] = {"candidate": winner, "ms": ms, "timed": times, "model_top1": ranked[0]}
            self._persist()
        return winner

    def choose_blockscale(self, x, w, x_scale, w_scale, name: str) -> str:
        """The config id for validated block-scaled fp8 operands (``name`` their dtype): the
        persisted winner of the shape, else the model's top k checked on these operands against
        its first choice and timed (``blockscale_bench``, or CUDA graphs over synthetic copies of
        the shape). The model's pick during CUDA-graph capture of a shape not tuned yet."""
        m, k = x.shape
        n = w.shape[0]
        key = f"{name}:{m}x{n}x{k}"
        won = self._op_winners[BS_OP_NAME]
        hit = won.get(key)
        if hit is not None:
            return hit
        d = dispatcher(BS_OP_NAME)
        ddt = _BS_DISPATCH_DTYPE[name]
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return d.select(m, n, k, ddt).candidate
        ranked = [c.candidate for c in d.rank(m, n, k, ddt, count=self.k)]
        bound = 2 * BS.ERROR_BOUNDS.get(name, 1e-2)

        def run(cid):
            return BS.launch(_config(cid, BS_OP_NAME), x, w, x_scale, w_scale)

        winner, ms, times = self._timed_pick(BS_OP_NAME, _BS_OP.space_module().Problem(m, n, k, name), ranked, run,
                                             lambda y, ref: _rel_diff(y, ref) <= bound, self.blockscale_bench)
        with self._lock:
            won[key] = winner
            self.op_entries[BS_OP_NAME][key] = {"candidate": winner, "ms": ms, "timed": times,
                                                "model_top1": ranked[0]}
            self._persist()
        return winner

    def choose_moe(self, x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale,
                   routing: str) -> tuple[str, str] | None:
        """(gate_up, down) config ids for a validated MoE layer: the persisted winners of its two
        stages, else each stage's top k, checked on these operands (gate_up first, then down on
        the winner's output) and timed (``moe_bench``, or CUDA graphs over synthetic copies of the
        stage for ``routing``). None during CUDA-graph capture of a layer not tuned yet (the
        caller asks the model)."""
        m, hidden, inter, e, top_k, dt = _moe_dims(x, w1, w2, topk_ids)
        keys = {"gate_up": f"{dt}:gate_up:{m}x{2 * inter}x{hidden}:e{e}k{top_k}",
                "down": f"{dt}:down:{m}x{hidden}x{inter}:e{e}k{top_k}"}
        won = self._op_winners[MOE_OP_NAME]
        if all(key in won for key in keys.values()):
            return won[keys["gate_up"]], won[keys["down"]]
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        d = dispatcher(MOE_OP_NAME)
        ddt = _MOE_DISPATCH_DTYPE[dt]
        bound = 2 * MOE.ERROR_BOUNDS.get(dt, 1e-2)

        def agree(y, ref):
            return _rel_diff(y, ref) <= bound

        fp8 = dt == "fp8"
        a1 = a1_scale if a1_scale is not None or not fp8 else MOE.dynamic_scale(x)
        picks = {}
        h = None
        for stage, (n, kk, inp, w, a_s, w_s) in (("gate_up", (2 * inter, hidden, x, w1, a1, w1_scale)),
                                                 ("down", (hidden, inter, None, w2, a2_scale, w2_scale))):
            if stage == "down":
                inp = h
                if fp8 and a_s is None:
                    a_s = MOE.dynamic_scale(h)
            key = keys[stage]
            winner = won.get(key)
            if winner is None:
                ranked = [c.candidate for c in d.rank(m, n, kk, ddt, count=self.k, e=e, top_k=top_k, stage=stage,
                                                       routing=routing)]

                def run(cid, stage=stage, inp=inp, w=w, a_s=a_s, w_s=w_s):
                    return MOE.launch(_config(cid, MOE_OP_NAME), stage, inp, w, topk_weights, topk_ids, None, a_s, w_s)

                winner, ms, times = self._timed_pick(
                    MOE_OP_NAME, _MOE_OP.space_module().Problem(m, n, kk, dt, e, top_k, stage, routing),
                    ranked, run, agree, self.moe_bench)
                with self._lock:
                    won[key] = winner
                    self.op_entries[MOE_OP_NAME][key] = {"candidate": winner, "ms": ms,
                                                         "timed": times, "model_top1": ranked[0],
                                                         "routing": routing}
            picks[stage] = winner
            if stage == "gate_up":
                h = MOE.launch(_config(winner, MOE_OP_NAME), "gate_up", x, w1, topk_weights, topk_ids, None, a1,
                               w1_scale)
        with self._lock:
            self._persist()
        return picks["gate_up"], picks["down"]

    def _persist(self) -> None:
        if not self.cache_file:
            return
        from gemm_costmodel.util import git_sha

        prov = {"gpu_name": self.d.gpu_name, "torch": torch.__version__, "git_sha": git_sha(),
                "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"), "k": self.k}
        try:
            import triton

            prov["triton"] = triton.__version__
        except ImportError:  # pragma: no cover
            pass
        body = {"format": "gemm_costmodel.tuned/1", "provenance": prov, "entries": self.entries}
        ops_part = {op: ent for op, ent in self.op_entries.items() if ent}
        if ops_part:
            body["ops"] = ops_part
        tmp = self.cache_file + ".tmp"
        os.makedirs(os.path.dirname(os.path.abspath(self.cache_file)), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(body, fh, indent=1)
        os.replace(tmp, self.cache_file)


def enable_unsure_mode(k: int = 8, cache_file: str | None = None, bench=None, moe_bench=None,
                       blockscale_bench=None) -> UnsureTuner:
    """Turn on unsure mode for the dense ops, the block-scaled fp8 GEMM and the MoE layer (see the
    module docstring for its cost). By default every candidate is timed by the harness's
    CUDA-graph timer over rotating synthetic copies of the problem; ``bench(fn) -> ms`` replaces
    that timer for every op (``fn`` runs the candidate on the call's operands), ``moe_bench`` for
    the MoE stages only and ``blockscale_bench`` for the block-scaled GEMM only."""
    global _unsure
    _unsure = UnsureTuner(dispatcher(GEMM_OP_NAME), k=k, cache_file=cache_file, bench=bench, moe_bench=moe_bench,
                          blockscale_bench=blockscale_bench)
    return _unsure


def disable_unsure_mode() -> None:
    """Back to model decisions."""
    global _unsure
    _unsure = None


# -- the fused MoE layer (op ``moe``) ------------------------------------------------------

MOE_OP_NAME = "moe"
_MOE_OP = registry.get(MOE_OP_NAME)
MOE = _MOE_OP.impl_module()
# The MoE dispatcher serves bf16 and fp8 models; fp16/fp32 (the CPU interpreter's stand-ins) are
# decided as fp16, which has no model: the fallback rule (vLLM's default) decides.
_MOE_DISPATCH_DTYPE = {"bf16": "bf16", "fp8": "fp8", "fp16": "fp16", "fp32": "fp16"}
# Exact-hit tables in vLLM's fused-MoE format: {(E, N = intermediate, dtype): {M: config id}}.
_moe_tables: dict[tuple[int, int, str], dict[int, str]] = {}
_VLLM_MOE_DTYPES = {None: "bf16", "fp8_w8a8": "fp8", "float8": "fp8"}


def load_vllm_moe_configs(folder: str, gpu_name: str | None = None) -> int:
    """Load vLLM-format fused-MoE tuned files (``E=..,N=..,device_name=..[,dtype=..].json``) for
    this GPU (default: the current CUDA device) as exact-hit tables: an M that is a key of the file
    of (E, N, dtype) launches that entry's config for both stages, before any model decision
    (vLLM's precedence; other M go to the model, not to vLLM's nearest key). Files of other GPUs,
    block-scaled or int8 dtypes are skipped. Returns the number of tables loaded; ValueError naming
    the file for an entry that is not a vLLM config or not in this op's space."""
    import re

    from gemm_costmodel.kernels.moe import space as MS
    from gemm_costmodel.serving.runtime import current_gpu_name

    gpu = gpu_name or current_gpu_name()
    if gpu is None:
        raise ValueError("no CUDA device: name the GPU (gpu_name=) whose files to load")
    want = gpu.replace(" ", "_")
    loaded = 0
    space_of: dict[str, set] = {}  # the space per dtype, built once per call
    for name in sorted(os.listdir(folder)):
        mt = re.match(MS.VLLM_FILE_NAME_RE, name)
        if not mt or mt.group("device") != want or mt.group("block") or mt.group("dtype") not in _VLLM_MOE_DTYPES:
            continue
        dt = _VLLM_MOE_DTYPES[mt.group("dtype")]
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            body = json.load(fh)
        table = {}
        for m, entry in body.items():
            if not str(m).isdigit():
                continue  # vLLM files may carry metadata keys (triton_version)
            try:
                cfg = MS.from_vllm(entry)
            except ValueError as exc:
                raise ValueError(f"{name}: M={m}: {exc}") from None
            if cfg not in space_of.setdefault(dt, set(MS.generate_configs("sm90", dt))):
                raise ValueError(f"{name}: M={m}: {cfg.id} is not in the moe space for {dt}")
            table[int(m)] = cfg.id
        _moe_tables[(int(mt.group("e")), int(mt.group("n")), dt)] = table
        loaded += 1
    return loaded


def clear_vllm_moe_configs() -> None:
    _moe_tables.clear()


def _moe_dims(x, w1, w2, topk_ids) -> tuple[int, int, int, int, int, str]:
    """(M, hidden, intermediate, E, top_k, dtype name) of checked operands."""
    m, hidden = x.shape
    e, n1, _ = w1.shape
    return m, hidden, n1 // 2, e, topk_ids.shape[1], MOE.DTYPE_NAMES[w1.dtype]


def choose_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
               topk_ids: torch.Tensor, routing: str = "balanced", *, w1_scale: torch.Tensor | None = None,
               w2_scale: torch.Tensor | None = None, a1_scale: torch.Tensor | None = None,
               a2_scale: torch.Tensor | None = None) -> tuple[str, str]:
    """(gate_up config id, down config id) ``fused_moe`` would launch (validates the operands).

    The decision reads host-side shapes only (M, hidden, intermediate, E, top_k, dtype): an exact
    M hit in a loaded vLLM table wins (one config for both stages, as vLLM runs it); else the
    model ranks each stage's candidates for the routing named here (default 'balanced': during
    CUDA-graph capture the expert histogram exists only on the GPU, so it is never read)."""
    msg = MOE.check_layer(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale)
    if msg:
        raise ValueError(msg)
    return _choose_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, routing)


def _choose_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale,
                routing) -> tuple[str, str]:
    m, hidden, inter, e, top_k, dt = _moe_dims(x, w1, w2, topk_ids)
    hit = _moe_tables.get((e, inter, dt), {}).get(m)
    if hit is not None:
        return hit, hit
    if _unsure is not None:
        tuned = _unsure.choose_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale,
                                   routing)
        if tuned is not None:
            return tuned
    d = dispatcher(MOE_OP_NAME)
    if not x.is_cuda and d.space_arch is None:
        # CPU tensors and no GPU to rank for: torch's own grouped GEMM runs them on the CPU.
        vendor = _MOE_OP.vendor_ids[0]
        return vendor, vendor
    ddt = _MOE_DISPATCH_DTYPE[dt]
    up = d.select(m, 2 * inter, hidden, ddt, e, top_k, stage="gate_up", routing=routing).candidate
    down = d.select(m, hidden, inter, ddt, e, top_k, stage="down", routing=routing).candidate
    return up, down


def _fused_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, routing):
    # Validated once per call (here), not again by impl.fused_moe.
    msg = MOE.check_layer(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale)
    if msg:
        raise ValueError(msg)
    up, down = _choose_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, routing)
    return MOE.fused_moe(x, w1, w2, topk_weights, topk_ids, _config(up, MOE_OP_NAME), _config(down, MOE_OP_NAME),
                         w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale, check=False)


@torch.library.custom_op("gemm_costmodel::fused_moe", mutates_args=())
def _fused_moe_op(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                  a1_scale: torch.Tensor | None = None, a2_scale: torch.Tensor | None = None,
                  routing: str = "balanced") -> torch.Tensor:
    return _fused_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, routing)


@_fused_moe_op.register_fake
def _(x, w1, w2, topk_weights, topk_ids, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None,
      routing="balanced"):
    if x.dim() != 2 or w1.dim() != 3 or w2.dim() != 3:
        raise ValueError("x must be 2-D (M, hidden), w1 and w2 3-D (E, 2I, hidden), (E, hidden, I)")
    if w1.dtype not in MOE.DTYPE_NAMES:
        raise ValueError(f"w1 must be bfloat16 or float8_e4m3fn (fp16/fp32 for the CPU interpreter), got {w1.dtype}")
    return x.new_empty((x.shape[0], w1.shape[2]), dtype=MOE.OUT_TORCH_DTYPES[MOE.DTYPE_NAMES[w1.dtype]])


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, *, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
              a1_scale: torch.Tensor | None = None, a2_scale: torch.Tensor | None = None,
              routing: str = "balanced") -> torch.Tensor:
    """The MoE layer on the dispatched kernels (vLLM's ``fused_experts``):
    y (M, hidden) = sum_j topk_weights[t, j] * (silu(x w1_e[:I].T) * (x w1_e[I:].T)) w2_e.T, e = topk_ids[t, j].

    x (M, hidden) bf16 (or fp8 with a1_scale); w1 (E, 2I, hidden), w2 (E, hidden, I) bf16, or fp8
    with per-expert fp32 scales w1_scale, w2_scale (E,) and optional static activation scales
    a1_scale, a2_scale (1,) (dynamic per-tensor when None); topk_ids int32 (M, top_k),
    topk_weights fp32 (M, top_k) (``route(router_logits, top_k)`` makes both). Each stage runs
    its own dispatched config (``choose_moe``). ValueError naming the bad argument."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.fused_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale,
                                                  a1_scale, a2_scale, routing)
    return _fused_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, routing)


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights fp32 (M, top_k), topk_ids int32 (M, top_k)) from router logits (M, E): softmax
    over experts, the top_k largest, renormalised to sum 1 per token with ``renormalize``."""
    return MOE.route(router_logits, top_k, renormalize)
