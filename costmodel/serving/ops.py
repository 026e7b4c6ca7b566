"""The torch custom ops, wired to the dispatchers: dispatch, then launch.

Each op's torch ops live in its own folder (the registry's ``torch_op`` field, e.g.
``kernels/moe/torch_op.py``) and take their decisions from the ``_Host`` this module binds to
them on import, so kernels never import serving. This module keeps what every op shares: one
dispatcher per op (``set_dispatcher(d)`` sets the one of ``d.op``), the config cache and unsure
mode; and it re-exports each op module's ``EXPORTS``, so users call ``ops.gemm``, ``ops.gemm_fp8``
(y = x @ w.T, nn.Linear layout), ``ops.gemm_fp8_blockscale``, ``ops.quantize_fp8_per_token_group``,
``ops.fused_moe`` and the others from here. All are torch custom ops
(``torch.ops.gemm_costmodel.<name>``) with fake implementations, so they trace under
torch.compile and replay inside CUDA graphs: the decision is made on the host from the shapes
alone, never by reading the GPU.

Unsure mode (opt-in, ``enable_unsure_mode``): the first call of a new shape
benchmarks the model's top k candidates on the GPU, keeps the fastest, and
persists the winner with provenance to a JSON file that later processes load as
a tuned table. Cost: about k x (compile ~0.4 s when not cached + ~30 ms timing)
on the first call per shape; none afterwards. Never benchmarks during CUDA-graph
capture (the model's choice is used there). It serves every op's torch ops alike:
the top k are checked against the model's first choice on the call's operands,
then timed as the dataset was timed, in CUDA graphs over rotating synthetic copies
of the problem (an MoE stage's for the routing the caller names; an exact vLLM-table
hit still wins first). A problem whose timing copies do not fit in device memory
keeps the model's choice.
"""
from __future__ import annotations

import importlib
import json
import os
import threading
from datetime import datetime, timezone
from typing import Callable

import torch

from gemm_costmodel import registry
from gemm_costmodel.serving.runtime import Dispatcher, default_dispatcher

# Set dispatchers (set_dispatcher), by op; an op without one uses runtime's default for the current GPU.
_dispatchers: dict[str, Dispatcher] = {}
# Config objects by (op, id): the ops share ids such as "cublas" with different meanings.
_configs: dict[tuple[str, str], object] = {}
_unsure: "UnsureTuner | None" = None


def set_dispatcher(d: Dispatcher | None, op: str | None = None) -> None:
    """Use ``d`` for the ops of ``op`` (default: ``d.op``). None goes back to the process-wide
    default for the current GPU: of ``op``, or of every op when ``op`` is None too. ValueError if
    ``d`` serves another op than ``op``, names no op, or ``op`` is unknown."""
    if d is None:
        if op is None:
            _dispatchers.clear()
            return
        registry.get(op)  # ValueError naming the known ops
        _dispatchers.pop(op, None)
        return
    d_op = getattr(d, "op", None)
    if op is None:
        op = d_op
    registry.get(op)  # ValueError naming the known ops
    if d_op != op:
        raise ValueError(f"the dispatcher serves op {d_op!r}, not {op!r}")
    _dispatchers[op] = d


def dispatcher(op: str) -> Dispatcher:
    """The dispatcher the ops of ``op`` use."""
    d = _dispatchers.get(op)
    return d if d is not None else default_dispatcher(op)


def _config(cid: str, op: str):
    cfg = _configs.get((op, cid))
    if cfg is None:
        cfg = _configs[(op, cid)] = registry.get(op).config_from_id(cid)
    return cfg


class _Host:
    """What an op's torch op module (registry ``torch_op``) asks of serving at call time, bound to
    it by ``bind(host)``, so that module imports nothing from serving."""

    def __init__(self, spec: registry.OpSpec):
        self.spec, self.op = spec, spec.name

    def dispatcher(self) -> Dispatcher:
        return dispatcher(self.op)

    def config(self, cid: str):
        """The config object of a candidate id of this op (cached)."""
        return _config(cid, self.op)

    def select(self, m: int, n: int, k: int, dtype: str, **fields) -> str:
        """The candidate id the dispatcher picks (tuned table, model or rule) for one problem."""
        return dispatcher(self.op).select(m, n, k, dtype, **fields).candidate

    @staticmethod
    def tuning() -> bool:
        """Whether unsure mode is on."""
        return _unsure is not None

    def tuned(self, key: str) -> str | None:
        """Unsure mode's persisted winner of ``key``, else None."""
        tuner = _unsure
        return tuner.winner(self.op, key) if tuner is not None else None

    def decide(self, m: int, n: int, k: int, dtype: str, *, key: str, run: Callable[[str], torch.Tensor],
               agree: Callable[[torch.Tensor, torch.Tensor], bool], problem: Callable[[], object],
               operand: torch.Tensor | None = None, note: dict | None = None, **fields) -> str:
        """``select`` outside unsure mode; in it, the winner persisted under ``key``, else the
        model's pick during CUDA-graph capture (of ``operand``'s stream), else the fastest of the
        model's top k whose output ``run(cid)`` on the call's operands ``agree``s with its first
        choice's, timed (``problem()``: the op's Problem, for the graph timer's synthetic copies);
        ``note`` joins the persisted entry."""
        tuner = _unsure
        if tuner is None:
            return self.select(m, n, k, dtype, **fields)
        return tuner.pick(self.op, dispatcher(self.op), key, (m, n, k, dtype), fields, run, agree, problem, operand,
                          note or {})


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


class UnsureTuner:
    """Benchmark the model's top k on first sight of a shape; cache and persist the winner.

    Each op's torch op names its keys (the dense ops ``<dtype>:<M>x<N>x<K>``, the tuned-table
    format, so the file is a Dispatcher tuned table; the MoE layer each stage as
    ``<dtype>:<stage>:<M>x<N>x<K>:e<E>k<top_k>``). A tuned table without an op field is the
    registry's ``LEGACY_OP``'s (the dense GEMM's), so that op's winners sit under ``"entries"`` and
    every other op's under ``"ops": {op: ...}``; Dispatcher tuned tables ignore ``"ops"``."""

    def __init__(self, k: int = 8, cache_file: str | None = None,
                 bench: Callable[[Callable[[], object]], float] | None = None,
                 op_benches: dict[str, Callable[[Callable[[], object]], float]] | None = None):
        if type(k) is not int or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        self.k, self.cache_file = k, cache_file
        self.gpu_name = None  # the GPU of the last dispatcher that ranked (the file's provenance)
        # An injected bench (tests) times every op unless an op's own is given too; by default
        # every op is timed by _graph_timer (CUDA graphs over rotating synthetic copies).
        self.bench = bench
        self.op_benches = {op: b for op, b in (op_benches or {}).items() if b is not None}
        self.entries: dict[str, dict] = {}
        self.op_entries: dict[str, dict[str, dict]] = {}
        self._lock = threading.Lock()
        if cache_file and os.path.isfile(cache_file):
            with open(cache_file, encoding="utf-8") as fh:
                body = json.load(fh)
            self.entries = dict(body.get("entries", {}))
            for op, ent in dict(body.get("ops", {})).items():
                self.op_entries.setdefault(op, {}).update(ent)
        self._winners = {key: e["candidate"] for key, e in self.entries.items()}
        self._op_winners = {op: {key: e["candidate"] for key, e in ent.items()} for op, ent in self.op_entries.items()}

    def winner(self, op: str, key: str) -> str | None:
        """The persisted winner of ``key`` for ``op``, else None."""
        if op == registry.LEGACY_OP:
            return self._winners.get(key)
        return self._op_winners.get(op, {}).get(key)

    def pick(self, op: str, d, key: str, problem_key: tuple, fields: dict, run, agree, problem, operand,
             note: dict) -> str:
        """The winner of ``key`` for one problem of ``op`` (see ``_Host.decide``); persisted."""
        hit = self.winner(op, key)
        if hit is not None:
            return hit
        m, n, k, dtype = problem_key
        if operand is not None and operand.is_cuda and torch.cuda.is_current_stream_capturing():
            return d.select(m, n, k, dtype, **fields).candidate
        ranked = [c.candidate for c in d.rank(m, n, k, dtype, count=self.k, **fields)]
        winner, ms, times = self._timed_pick(op, problem, ranked, run, agree, self.op_benches.get(op, self.bench))
        with self._lock:
            self.gpu_name = getattr(d, "gpu_name", self.gpu_name)
            if op == registry.LEGACY_OP:
                self._winners[key] = winner
                entries = self.entries
            else:
                self._op_winners.setdefault(op, {})[key] = winner
                entries = self.op_entries.setdefault(op, {})
            entries[key] = {"candidate": winner, "ms": ms, "timed": times, "model_top1": ranked[0], **note}
            self._persist()
        return winner

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
        synthetic copies of ``problem()``; without CUDA, or without device memory for those copies,
        the model's first choice wins untimed."""
        if bench is not None:
            return self._pick(ranked, run, lambda cid: bench(lambda: run(cid)), agree)
        if not torch.cuda.is_available():  # the CPU interpreter: no graph timer to time with
            return ranked[0], None, {}
        try:
            time_of, release = _graph_timer(op_name, problem())
        except torch.OutOfMemoryError:
            return ranked[0], None, {}
        try:
            return self._pick(ranked, run, time_of, agree)
        finally:
            release()

    def _persist(self) -> None:
        if not self.cache_file:
            return
        from gemm_costmodel.util import git_sha

        prov = {"gpu_name": self.gpu_name, "torch": torch.__version__, "git_sha": git_sha(),
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


# Each op's torch op module, bound to its host; its EXPORTS become this module's names (the
# public API: ops.gemm, ops.fused_moe, ...), so adding an op never edits this file.
_TORCH_OPS = {}
for _spec in registry.REGISTRY.values():
    if _spec.torch_op:
        _mod = _TORCH_OPS[_spec.name] = importlib.import_module(_spec.torch_op)
        _mod.bind(_Host(_spec))
        globals().update({_name: getattr(_mod, _name) for _name in _mod.EXPORTS})
# enable_unsure_mode's keywords for one op's bench (e.g. moe_bench), from the op modules.
_BENCH_KWARGS = {m.UNSURE_BENCH: op for op, m in _TORCH_OPS.items() if getattr(m, "UNSURE_BENCH", "")}


def enable_unsure_mode(k: int = 8, cache_file: str | None = None, bench=None, **op_benches) -> UnsureTuner:
    """Turn on unsure mode for every op's torch ops (see the module docstring for its cost). By
    default every candidate is timed by the harness's CUDA-graph timer over rotating synthetic
    copies of the problem; ``bench(fn) -> ms`` replaces that timer for every op (``fn`` runs the
    candidate on the call's operands), and an op module's ``UNSURE_BENCH`` keyword for that op's
    candidates only (``moe_bench`` for the MoE stages, ``blockscale_bench`` for the block-scaled
    GEMM)."""
    global _unsure
    unknown = sorted(set(op_benches) - set(_BENCH_KWARGS))
    if unknown:
        raise TypeError(f"enable_unsure_mode() got unexpected keyword arguments {unknown}; "
                        f"per-op benches: {sorted(_BENCH_KWARGS)}")
    _unsure = UnsureTuner(k=k, cache_file=cache_file, bench=bench,
                          op_benches={_BENCH_KWARGS[kw]: b for kw, b in op_benches.items()})
    return _unsure


def disable_unsure_mode() -> None:
    """Back to model decisions."""
    global _unsure
    _unsure = None
