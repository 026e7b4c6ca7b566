"""cuBLASLt heuristic decoding (the query itself needs a GPU)."""
import pytest

from gemm_costmodel.benchmarks import cublaslt


def test_tile_ids_follow_the_header_enum():
    assert cublaslt.tile_shape(23) == (128, 256)   # CUBLASLT_MATMUL_TILE_128x256
    assert cublaslt.tile_shape(184) == (144, 128)  # an nvjet tile seen on the H100
    assert cublaslt.tile_shape(645) == (256, 1)    # last value of the 13.x enum
    assert cublaslt.tile_shape(0) == (0, 0) and cublaslt.tile_shape(10_000) == (0, 0)


def test_decode_swaps_cublas_m_and_n_into_ours():
    # H100 probe, bf16 100x9216x3072: nvjet_sm90_tst_144x64_64x8_1x2_h_bz_TNN
    raw = {"tile_id": 183, "stages_id": 35, "cluster_id": 5, "splitk": 1, "waves": 0.97, "workspace": 0,
           "algo_id": 66}
    assert cublaslt.tile_shape(183) == (144, 64)
    d = cublaslt.decode(raw)
    assert (d["tile_n"], d["tile_m"]) == (144, 64)        # 9216 / 144 x ceil(100 / 64) = 128 tiles
    assert (d["cluster_n"], d["cluster_m"]) == (1, 2)
    assert (d["stage_k"], d["stages"], d["splitk"]) == (64, 0, 1)


def test_bad_inputs_and_no_gpu_raise_clearly():
    with pytest.raises(ValueError, match="dtype"):
        cublaslt.heuristic(1, 2, 3, "int4")
    with pytest.raises(ValueError, match="positive"):
        cublaslt.heuristic(0, 2, 3, "bf16")
    if not cublaslt.available():
        with pytest.raises(cublaslt.Unavailable):
            cublaslt.heuristic(16, 4096, 4096, "bf16")
