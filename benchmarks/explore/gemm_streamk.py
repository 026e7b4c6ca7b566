"""Stream-K GEMM over TMA descriptors, v2: data-parallel + stream-K hybrid with a
deterministic, atomic-free fixup (exploration; not in the config space). A record, not
part of the installed package: benchmarks/explore/explore_streamk.py times it, tests/test_gemm_streamk.py
checks it in the interpreter; both import it as ``gemm_streamk`` (module doc of benchmarks/explore/).

Why stream-K: on prefill shapes with few output tiles (M=1024, N=2304: 72 tiles
of 128x256 on 132 SMs) the persistent kernel leaves SMs idle, and cuBLAS is up
to 1.5x faster there (benchmarks/results/foundation/). Stream-K shares the
(tile, K-iteration) space among the programs instead of whole tiles, so every
SM works until the end.

Why v2: the first version (pure stream-K; split tiles summed with
``tl.atomic_add`` of whole fp32 tiles into an M x N workspace; the K loop inside
a ``while`` loop with int64 iteration math) was 1.67x slower (geomean) than the
best committed persistent candidate on 26 H100 prefill shapes (1.26x-3.10x;
1024x896x448: 16 us vs 5 us, benchmarks/results/streamk/streamk.json). It paid
for millions of L2 atomics (~20 MB of fp32 atomic traffic on 1024x2304x3584)
and split nearly every tile even when there were full waves of tiles. (Its
``while`` loop did not stop pipelining: compiled for sm_90a, with triton 3.6
and 3.9, its K loop has the same async TMA loads and async wgmma as the
persistent kernel's; so do both K loops below.) This version:

- Hybrid schedule. With P programs and T tiles: if T % P == 0 every tile is
  data-parallel. Otherwise the last T % P tiles, plus one more full wave of P
  tiles when T >= 2P (the Stream-K paper's "two-tile SK + DP"), form the
  stream-K region, whose (tile, k-iteration) space is split evenly among the
  programs; the tiles before it are data-parallel: program p computes tiles
  p, p + P, ... whole, exactly like the persistent kernel of kernels/gemm/kernel.py
  (same ``tl.range`` tile loop, plain ``for`` K loop, so both pipeline alike).
  Data-parallel tiles come first, then the stream-K region.
- The stream-K part is also a ``for`` loop over the (at most a few) tiles that
  a program's range touches, each with a plain ``for`` K loop over int32
  bounds; int64 is used once per program, for the range ends. The region is
  shared among Q = min(P, its iterations) programs, so no range is empty.
- Atomic-free fixup. A program's range has at most two partial segments (the
  tail of the tile it starts inside, the head of the tile it ends inside; a
  range inside one tile is a single segment). Each partial fp32 accumulator is
  stored with plain stores into the program's own workspace slot (2*pid for
  its first segment, 2*pid + 1 for its last; BLOCK_M x BLOCK_N fp32 each),
  then, after a barrier, one scalar acq_rel atomic bumps the tile's arrival
  counter. The last contributor to arrive sums the contributors' slots in
  ascending program order, applies the fp8 scales, stores y and resets the
  counter to 0. Its own partial is read back from L2 rather than taken from
  registers: adding the MMA-layout accumulator to blocked-layout loads made
  ptxas use 255 registers and spill (128x256 tile, 8 warps, triton 3.9,
  sm_90a); reading it back, 170 and no spills. The sum's order never depends
  on arrival order, so results are bitwise identical across launches.
- Nothing ever waits on another program, so any grid size is safe (no
  co-residency assumption), though load balance assumes one wave.

Same layout and contract as kernels/gemm/kernel.py: y = x @ w.T, x (M, K), w (N, K),
row-major, 16-byte aligned rows (TMA). y is stored through a TMA descriptor
when its rows are 16-byte aligned, else through masked pointers. The arrival
counters are left zeroed by every launch (CUDA-graph safe while one stream
uses them at a time); the workspace needs no zeroing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gemm_costmodel.kernels.common import (_arrival_counters, _device_index, _grouped_tile, launch_args, num_sms,
                                           zeroed_buffer)
from gemm_costmodel.kernels.gemm.kernel import PERSISTENT_FLATTEN


@dataclass(frozen=True)
class StreamKConfig:
    """One stream-K candidate; ``programs_per_sm`` scales the grid (1 = one program per SM).

    Not a subclass of PersistentConfig, though the fields match: gemm.launch would
    take it for one and run the persistent kernel instead.
    """

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 1
    variant = "streamk"

    @property
    def id(self) -> str:
        return (f"streamk_m{self.block_m}n{self.block_n}k{self.block_k}_g{self.group_m}"
                f"_p{self.programs_per_sm}_w{self.num_warps}s{self.num_stages}")


@triton.jit
def _tile_acc(x_desc, w_desc, off_m, off_n, k0, k1, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
    # fp32 sum over k-tiles [k0, k1) of one output tile. TMA zero-fills
    # out-of-bounds boxes, so neither the K tail nor ragged M/N needs a mask.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(k0, k1):
        a = x_desc.load([off_m, kt * BLOCK_K])
        b = w_desc.load([off_n, kt * BLOCK_K])
        acc = tl.dot(a, b.T, acc)
    return acc


@triton.jit
def _store_y(y, acc, off_m, off_n, M, N, stride_ym, scale, HAS_SCALE: tl.constexpr,
             Y_DESC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    if HAS_SCALE:
        acc = acc * scale
    if Y_DESC:
        y.store([off_m, off_n], acc.to(y.dtype))
    else:
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y.dtype.element_ty),
                 mask=mask)


@triton.jit(do_not_specialize=["M"])
def gemm_streamk_kernel(x_desc, w_desc, y, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N, K, stride_ym,
                        HAS_SCALE: tl.constexpr, Y_DESC: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        NUM_PROGRAMS: tl.constexpr, FLATTEN: tl.constexpr, REVERSED: tl.constexpr):
    """Data-parallel tiles first (whole, persistent order), then the stream-K region,
    whose S = sk_tiles * k_tiles iterations program p shares as [p*S//Q, (p+1)*S//Q),
    Q = min(P, S) (so no range is empty). ``y`` is a descriptor if Y_DESC, else a pointer.
    REVERSED numbers the programs backwards (tests: the interpreter runs programs in
    ascending order, so this is how it sees another arrival order)."""
    pid = tl.program_id(0)
    if REVERSED:
        pid = NUM_PROGRAMS - 1 - pid
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles = num_pid_m * num_pid_n
    rem = tiles % NUM_PROGRAMS
    sk_tiles = rem
    if (rem != 0) & (tiles >= 2 * NUM_PROGRAMS):
        sk_tiles += NUM_PROGRAMS
    dp_tiles = tiles - sk_tiles
    scale = 1.0
    if HAS_SCALE:
        scale = tl.load(sa_ptr) * tl.load(sb_ptr)

    for tile in tl.range(pid, dp_tiles, NUM_PROGRAMS, flatten=FLATTEN):
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tile_acc(x_desc, w_desc, off_m, off_n, 0, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K)
        _store_y(y, acc, off_m, off_n, M, N, stride_ym, scale, HAS_SCALE, Y_DESC, BLOCK_M, BLOCK_N)

    # Stream-K region. int64 only here, once per program: S * P can pass 2**31.
    total = sk_tiles.to(tl.int64) * k_tiles
    sk_progs = tl.minimum(total, NUM_PROGRAMS)
    if pid < sk_progs:
        start = pid * total // sk_progs
        end = (pid + 1) * total // sk_progs
        first_t = (start // k_tiles).to(tl.int32)
        last_t = ((end - 1) // k_tiles).to(tl.int32)
        start32 = start.to(tl.int32)
        end32 = end.to(tl.int32)
        slot_elems: tl.constexpr = BLOCK_M * BLOCK_N
        offs_slot = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        for t in range(first_t, last_t + 1):
            t_begin = t * k_tiles
            k0 = tl.maximum(start32 - t_begin, 0)
            k1 = tl.minimum(end32 - t_begin, k_tiles)
            pid_m, pid_n = _grouped_tile(dp_tiles + t, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc = _tile_acc(x_desc, w_desc, off_m, off_n, k0, k1, BLOCK_M, BLOCK_N, BLOCK_K)
            if (k0 == 0) & (k1 == k_tiles):
                _store_y(y, acc, off_m, off_n, M, N, stride_ym, scale, HAS_SCALE, Y_DESC,
                         BLOCK_M, BLOCK_N)
            else:
                # Slot 2*pid: the first segment of the range; 2*pid + 1: the last.
                own_slot = 2 * pid + (t != first_t).to(tl.int32)
                tl.store(ws_ptr + own_slot * slot_elems + offs_slot, acc)
                # Every thread's partial precedes the release of the arrival count.
                tl.debug_barrier()
                arrived = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
                # Contributors: the owners of the tile's first and last iteration
                # (the owner of x is ((x + 1) * Q - 1) // S) and all programs between.
                t_begin64 = t_begin.to(tl.int64)
                first = (((t_begin64 + 1) * sk_progs - 1) // total).to(tl.int32)
                last = (((t_begin64 + k_tiles) * sk_progs - 1) // total).to(tl.int32)
                if arrived == last - first:
                    tl.debug_barrier()
                    # The first contributor started inside the tile (slot 0) or
                    # before it (the tile is its last segment: slot 1); the
                    # others all start inside it (slot 0). Summed in ascending
                    # program order whoever arrives last: deterministic. Its own
                    # partial is read back too (module doc: register pressure).
                    first_start = first.to(tl.int64) * total // sk_progs
                    first_slot = 2 * first + (first_start < t_begin64).to(tl.int32)
                    out = tl.load(ws_ptr + first_slot * slot_elems + offs_slot, cache_modifier=".cg")
                    for q in range(first + 1, last + 1):
                        out += tl.load(ws_ptr + (2 * q) * slot_elems + offs_slot, cache_modifier=".cg")
                    _store_y(y, out, off_m, off_n, M, N, stride_ym, scale, HAS_SCALE, Y_DESC,
                             BLOCK_M, BLOCK_N)
                    tl.atomic_xchg(cnt_ptr + t, 0, sem="relaxed", scope="gpu")


def _workspace(device: torch.device, n: int) -> torch.Tensor:
    """fp32 partial-sum slots (2 per program, BLOCK_M x BLOCK_N each), kept per device.
    The kernel never relies on their contents (every slot read in a launch was written in
    it); the shared cached-buffer helper just happens to hand them out zeroed."""
    return zeroed_buffer("streamk_slots", device, n, torch.float32, 1 << 20)


def feasible(cfg: StreamKConfig, k: int, in_bytes: int) -> tuple[bool, str]:
    """TMA loads need 16-byte aligned rows of x and w (K) and boxes of at most 256 (y
    falls back to pointer stores when its rows are not aligned, so M and N are free)."""
    if (k * in_bytes) % 16:
        return False, "K * element size must be a multiple of 16 bytes (TMA)"
    if max(cfg.block_m, cfg.block_n, cfg.block_k) > 256:
        return False, "TMA box dims are at most 256"
    return True, ""


def _y_tma_ok(out: torch.Tensor) -> bool:
    es = out.element_size()
    return (out.stride(1) == 1 and (out.stride(0) * es) % 16 == 0 and out.data_ptr() % 16 == 0)


def split(tiles: int, programs: int) -> tuple[int, int]:
    """(data-parallel tiles, stream-K tiles) of the hybrid schedule (mirrors the kernel)."""
    rem = tiles % programs
    sk = rem + programs if rem and tiles >= 2 * programs else rem
    return tiles - sk, sk


def launch(cfg: StreamKConfig, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
           scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None, *,
           programs: int | None = None, _reversed: bool = False) -> torch.Tensor:
    """Run a stream-K candidate for y = x @ w.T (times scale_a * scale_b for fp8). Returns y.

    ``programs`` overrides the grid (default: SM count x cfg.programs_per_sm, at most the
    number of (tile, k-iteration) pairs). ``_reversed`` is for tests (see the kernel).
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, N, K, out, has_scale, sa, sb = launch_args(x, w, out, scale_a, scale_b)
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    total = tiles * triton.cdiv(K, cfg.block_k)
    if programs is None:
        programs = num_sms(_device_index(x)) * cfg.programs_per_sm
    programs = max(1, min(programs, total))
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k])
    y_desc = _y_tma_ok(out)
    y = TensorDescriptor.from_tensor(out, [cfg.block_m, cfg.block_n]) if y_desc else out
    ws = _workspace(x.device, 2 * programs * cfg.block_m * cfg.block_n)
    cnt = _arrival_counters(x.device, split(tiles, programs)[1])
    gemm_streamk_kernel[(programs,)](
        x_desc, w_desc, y, ws, cnt, sa, sb, M, N, K, out.stride(0), HAS_SCALE=has_scale, Y_DESC=y_desc,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        NUM_PROGRAMS=programs, FLATTEN=PERSISTENT_FLATTEN, REVERSED=_reversed,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
