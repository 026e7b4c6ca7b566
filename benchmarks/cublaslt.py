"""cuBLASLt's own heuristic choice for a GEMM, read on the host through ctypes.

cuBLAS's latency on a shape follows the kernel its heuristic picks (tile, split-K,
cluster, waves); ``heuristic`` returns that pick, ``decode`` its numbers. On the H100 with torch
2.11 the top pick is the kernel torch.mm runs on every bf16/fp16 dataset shape
(95% for fp8; benchmarks/vendor_probe.py checks it against profiler kernel
names). It is a host call: no GPU work, no stream sync. It needs a CUDA driver
and the cuBLASLt that torch ships; ``available`` says whether both are there.

The problem is the one torch issues for nn.Linear's ``y = x @ w.T``: in cuBLAS's
column-major terms D (N x M) = op(A) op(B) with A = w (transposed), B = x, so
cuBLAS's (m, n, k) is our (N, M, K). fp8 is e4m3 inputs with bf16 output, as
``torch._scaled_mm`` runs it.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys

# CUBLASLT_MATMUL_TILE_* by enum value, from cublasLt.h (13.x); value 0 is UNDEFINED.
_TILE_NAMES = """
8x8 8x16 16x8 8x32 16x16 32x8 8x64 16x32 32x16 64x8 32x32 32x64 64x32 32x128 64x64 128x32 64x128
128x64 64x256 128x128 256x64 64x512 128x256 256x128 512x64 64x96 96x64 96x128 128x160 160x128
192x128 128x192 128x96 32x256 256x32 8x128 8x192 8x256 8x320 8x384 8x448 8x512 8x576 8x640 8x704
8x768 16x64 16x128 16x192 16x256 16x320 16x384 16x448 16x512 16x576 16x640 16x704 16x768 24x64
24x128 24x192 24x256 24x320 24x384 24x448 24x512 24x576 24x640 24x704 24x768 32x192 32x320
32x384 32x448 32x512 32x576 32x640 32x704 32x768 40x64 40x128 40x192 40x256 40x320 40x384 40x448
40x512 40x576 40x640 40x704 40x768 48x64 48x128 48x192 48x256 48x320 48x384 48x448 48x512 48x576
48x640 48x704 48x768 56x64 56x128 56x192 56x256 56x320 56x384 56x448 56x512 56x576 56x640 56x704
56x768 64x192 64x320 64x384 64x448 64x576 64x640 64x704 64x768 72x64 72x128 72x192 72x256 72x320
72x384 72x448 72x512 72x576 72x640 80x64 80x128 80x192 80x256 80x320 80x384 80x448 80x512 80x576
88x64 88x128 88x192 88x256 88x320 88x384 88x448 88x512 96x192 96x256 96x320 96x384 96x448 96x512
104x64 104x128 104x192 104x256 104x320 104x384 104x448 112x64 112x128 112x192 112x256 112x320
112x384 120x64 120x128 120x192 120x256 120x320 120x384 128x320 128x384 136x64 136x128 136x192
136x256 136x320 144x64 144x128 144x192 144x256 144x320 152x64 152x128 152x192 152x256 152x320
160x64 160x192 160x256 168x64 168x128 168x192 168x256 176x64 176x128 176x192 176x256 184x64
184x128 184x192 184x256 192x64 192x192 192x256 200x64 200x128 200x192 208x64 208x128 208x192
216x64 216x128 216x192 224x64 224x128 224x192 232x64 232x128 232x192 240x64 240x128 240x192
248x64 248x128 248x192 256x192 264x64 264x128 272x64 272x128 280x64 280x128 288x64 288x128
296x64 296x128 304x64 304x128 312x64 312x128 320x64 320x128 328x64 328x128 336x64 336x128 344x64
344x128 352x64 352x128 360x64 360x128 368x64 368x128 376x64 376x128 384x64 384x128 392x64 400x64
408x64 416x64 424x64 432x64 440x64 448x64 456x64 464x64 472x64 480x64 488x64 496x64 504x64
520x64 528x64 536x64 544x64 552x64 560x64 568x64 576x64 584x64 592x64 600x64 608x64 616x64
624x64 632x64 640x64 648x64 656x64 664x64 672x64 680x64 688x64 696x64 704x64 712x64 720x64
728x64 736x64 744x64 752x64 760x64 768x64 64x16 64x24 64x40 64x48 64x56 64x72 64x80 64x88 64x104
64x112 64x120 64x136 64x144 64x152 64x160 64x168 64x176 64x184 64x200 64x208 64x216 64x224
64x232 64x240 64x248 64x264 64x272 64x280 64x288 64x296 64x304 64x312 64x328 64x336 64x344
64x352 64x360 64x368 64x376 64x392 64x400 64x408 64x416 64x424 64x432 64x440 64x456 64x464
64x472 64x480 64x488 64x496 64x504 64x520 64x528 64x536 64x544 64x552 64x560 64x568 64x584
64x592 64x600 64x608 64x616 64x624 64x632 64x648 64x656 64x664 64x672 64x680 64x688 64x696
64x712 64x720 64x728 64x736 64x744 64x752 64x760 128x8 128x16 128x24 128x40 128x48 128x56 128x72
128x80 128x88 128x104 128x112 128x120 128x136 128x144 128x152 128x168 128x176 128x184 128x200
128x208 128x216 128x224 128x232 128x240 128x248 128x264 128x272 128x280 128x288 128x296 128x304
128x312 128x328 128x336 128x344 128x352 128x360 128x368 128x376 128x392 128x400 128x408 128x416
128x424 128x432 128x440 128x448 128x456 128x464 128x472 128x480 128x488 128x496 128x504 128x512
192x8 192x16 192x24 192x32 192x40 192x48 192x56 192x72 192x80 192x88 192x96 192x104 192x112
192x120 192x136 192x144 192x152 192x160 192x168 192x176 192x184 192x200 192x208 192x216 192x224
192x232 192x240 192x248 192x264 192x272 192x280 192x288 192x296 192x304 192x312 192x320 192x328
192x336 256x8 256x16 256x24 256x40 256x48 256x56 256x72 256x80 256x88 256x96 256x104 256x112
256x120 256x136 256x144 256x152 256x160 256x168 256x176 256x184 256x200 256x208 256x216 256x224
256x232 256x240 256x248 256x256 320x8 320x16 320x24 320x32 320x40 320x48 320x56 320x72 320x80
320x88 320x96 320x104 320x112 320x120 320x136 320x144 320x152 320x160 320x168 320x176 320x184
320x192 320x200 384x8 384x16 384x24 384x32 384x40 384x48 384x56 384x72 384x80 384x88 384x96
384x104 384x112 384x120 384x136 384x144 384x152 384x160 384x168 448x8 448x16 448x24 448x32
448x40 448x48 448x56 448x72 448x80 448x88 448x96 448x104 448x112 448x120 448x128 448x136 448x144
512x8 512x16 512x24 512x32 512x40 512x48 512x56 512x72 512x80 512x88 512x96 512x104 512x112
512x120 512x128 576x8 576x16 576x24 576x32 576x40 576x48 576x56 576x72 576x80 576x88 576x96
576x104 576x112 640x8 640x16 640x24 640x32 640x40 640x48 640x56 640x72 640x80 640x88 640x96
704x8 704x16 704x24 704x32 704x40 704x48 704x56 704x72 704x80 704x88 768x8 768x16 768x24 768x32
768x40 768x48 768x56 768x72 768x80 256x512 256x1024 512x512 512x1024 4x1 8x1 16x1 24x1 32x1 40x1
48x1 64x1 128x1 192x1 256x1
""".split()
# CUBLASLT_MATMUL_STAGES_*: value -> (k per stage, stages); 0 stages = chosen by the kernel (AUTO).
_STAGES = {1: (16, 1), 2: (16, 2), 3: (16, 3), 4: (16, 4), 5: (16, 5), 6: (16, 6), 7: (32, 1), 8: (32, 2),
           9: (32, 3), 10: (32, 4), 11: (32, 5), 12: (32, 6), 13: (64, 1), 14: (64, 2), 15: (64, 3), 16: (64, 4),
           17: (64, 5), 18: (64, 6), 19: (128, 1), 20: (128, 2), 21: (128, 3), 22: (128, 4), 23: (128, 5),
           24: (128, 6), 25: (32, 10), 26: (8, 4), 27: (16, 10), 28: (8, 5), 31: (8, 3), 32: (8, 0), 33: (16, 0),
           34: (32, 0), 35: (64, 0), 36: (128, 0), 37: (256, 0), 38: (768, 0)}
# CUBLASLT_CLUSTER_SHAPE_*: value -> (cluster m, cluster n); 0 = AUTO.
_CLUSTERS = {2: (1, 1), 3: (2, 1), 4: (4, 1), 5: (1, 2), 6: (2, 2), 7: (4, 2), 8: (1, 4), 9: (2, 4), 10: (4, 4),
             11: (8, 1), 12: (1, 8), 13: (8, 2), 14: (2, 8), 15: (16, 1), 16: (1, 16), 17: (3, 1), 18: (5, 1),
             19: (6, 1), 20: (7, 1), 21: (9, 1), 22: (10, 1), 23: (11, 1), 24: (12, 1), 25: (13, 1), 26: (14, 1),
             27: (15, 1), 28: (3, 2), 29: (5, 2), 30: (6, 2), 31: (7, 2), 32: (1, 3), 33: (2, 3), 34: (3, 3),
             35: (4, 3), 36: (5, 3), 37: (3, 4), 38: (1, 5), 39: (2, 5), 40: (3, 5), 41: (1, 6), 42: (2, 6),
             43: (1, 7), 44: (2, 7), 45: (1, 9), 46: (1, 10), 47: (1, 11), 48: (1, 12), 49: (1, 13), 50: (1, 14),
             51: (1, 15)}

_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF, _CUDA_R_8F_E4M3 = 0, 2, 14, 28
_COMPUTE_32F = 68
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_DESC_A_SCALE_POINTER, _DESC_B_SCALE_POINTER = 17, 18
_PREF_MAX_WORKSPACE_BYTES = 1
# ALGO_CONFIG attributes: (id, ctypes type)
_ALGO_ATTRS = {"algo_id": (0, ctypes.c_int32), "tile_id": (1, ctypes.c_uint32), "splitk": (2, ctypes.c_uint32),
               "reduction": (3, ctypes.c_uint32), "swizzle": (4, ctypes.c_uint32), "custom": (5, ctypes.c_uint32),
               "stages_id": (6, ctypes.c_uint32), "inner_shape_id": (7, ctypes.c_uint16),
               "cluster_id": (8, ctypes.c_uint16)}
# (A/B type, C/D type) per dtype of this product.
_TYPES = {"bf16": (_CUDA_R_16BF, _CUDA_R_16BF), "fp16": (_CUDA_R_16F, _CUDA_R_16F),
          "fp8": (_CUDA_R_8F_E4M3, _CUDA_R_16BF)}
# torch's default cuBLAS workspace on Hopper (CUBLAS_WORKSPACE_CONFIG ":4096:8").
DEFAULT_WORKSPACE = 32 << 20


class Unavailable(RuntimeError):
    """No CUDA driver or no cuBLASLt library in this process."""


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Result(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _candidates():
    yield from ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")
    # pip wheels (torch's own copy): <site-packages>/nvidia/{cu13,cublas}/lib
    for base in sys.path:
        for pat in ("nvidia/cu13/lib/libcublasLt.so*", "nvidia/cublas/lib/libcublasLt.so*"):
            yield from sorted(glob.glob(os.path.join(base, pat)))


@functools.lru_cache(maxsize=1)
def _lib():
    errors = []
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
            continue
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
        return lib
    raise Unavailable("cuBLASLt not found: " + (errors[-1] if errors else "no candidate path"))


def _check(status: int, what: str) -> None:
    if status != 0:
        raise Unavailable(f"{what} failed with cublasStatus {status}")


@functools.lru_cache(maxsize=1)
def _handle():
    h = ctypes.c_void_p()
    _check(_lib().cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
    return h


def version() -> int:
    """cuBLASLt's version number (e.g. 130000), or raises Unavailable."""
    return int(_lib().cublasLtGetVersion())


def available() -> bool:
    """Whether ``heuristic`` can run in this process (a CUDA driver and cuBLASLt)."""
    try:
        _handle()
        return True
    except (Unavailable, AttributeError):
        return False


def tile_shape(tile_id: int) -> tuple[int, int]:
    """(rows, cols) of a CUBLASLT_MATMUL_TILE_* value; (0, 0) for UNDEFINED or unknown."""
    if 1 <= tile_id <= len(_TILE_NAMES):
        a, b = _TILE_NAMES[tile_id - 1].split("x")
        return int(a), int(b)
    return 0, 0


def decode(raw: dict) -> dict:
    """Numbers from one raw heuristic result: tile, stages, cluster, split-K, waves.

    cuBLAS's tile rows run along its m, which is our N (see the module doc)."""
    tm, tn = tile_shape(int(raw["tile_id"]))
    sk, st = _STAGES.get(int(raw["stages_id"]), (0, 0))
    cm, cn = _CLUSTERS.get(int(raw["cluster_id"]), (0, 0))
    return {"tile_n": tm, "tile_m": tn, "stage_k": sk, "stages": st, "cluster_n": cm, "cluster_m": cn,
            "splitk": max(int(raw["splitk"]), 1), "waves": float(raw["waves"]),
            "workspace": int(raw["workspace"]), "algo_id": int(raw["algo_id"])}


def heuristic(m: int, n: int, k: int, dtype: str, count: int = 1,
              workspace: int = DEFAULT_WORKSPACE) -> list[dict]:
    """cuBLASLt's ``count`` best algorithms for y(M, N) = x(M, K) @ w(N, K).T, best first.

    Each is a dict of the raw ALGO_CONFIG attributes plus ``waves`` and ``workspace``.
    Raises Unavailable without a CUDA driver or cuBLASLt, ValueError for a bad dtype."""
    if dtype not in _TYPES:
        raise ValueError(f"dtype {dtype!r} not one of {sorted(_TYPES)}")
    if min(m, n, k) < 1:
        raise ValueError(f"shape ({m}, {n}, {k}) must be positive")
    lib, h = _lib(), _handle()
    ab, cd = _TYPES[dtype]
    desc, la, lb, lc, pref = (ctypes.c_void_p() for _ in range(5))
    try:
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _CUDA_R_32F), "MatmulDescCreate")
        for attr, op in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
            v = ctypes.c_int32(op)
            _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), ctypes.sizeof(v)), "DescSet")
        if dtype == "fp8":
            # torch._scaled_mm passes per-tensor scale pointers; the heuristic only
            # needs them set (it never reads them), so any device-sized address does.
            dummy = ctypes.c_void_p(256)
            for attr in (_DESC_A_SCALE_POINTER, _DESC_B_SCALE_POINTER):
                _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(dummy), ctypes.sizeof(dummy)),
                       "DescSet scale")
        u64, i64 = ctypes.c_uint64, ctypes.c_int64
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(la), ab, u64(k), u64(n), i64(k)), "LayoutCreate A")
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lb), ab, u64(k), u64(m), i64(k)), "LayoutCreate B")
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lc), cd, u64(n), u64(m), i64(n)), "LayoutCreate C")
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        ws = ctypes.c_uint64(workspace)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws),
                                                         ctypes.sizeof(ws)), "PreferenceSet")
        results = (_Result * count)()
        got = ctypes.c_int(0)
        _check(lib.cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, count, results,
                                                   ctypes.byref(got)), "AlgoGetHeuristic")
        out = []
        for r in results[:got.value]:
            if r.state != 0:
                continue
            row = {"waves": float(r.waves), "workspace": int(r.workspace)}
            for name, (attr, ctype) in _ALGO_ATTRS.items():
                v, written = ctype(0), ctypes.c_size_t(0)
                _check(lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(r.algo), attr, ctypes.byref(v),
                                                                ctypes.sizeof(v), ctypes.byref(written)),
                       "AlgoConfigGetAttribute")
                row[name] = int(v.value)
            out.append(row)
        return out
    finally:
        for fn, obj in (("cublasLtMatmulPreferenceDestroy", pref), ("cublasLtMatrixLayoutDestroy", lc),
                        ("cublasLtMatrixLayoutDestroy", lb), ("cublasLtMatrixLayoutDestroy", la),
                        ("cublasLtMatmulDescDestroy", desc)):
            if obj.value:
                getattr(lib, fn)(obj)
