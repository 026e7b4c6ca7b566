"""The triton.autotune adapter: the config list, the perf model, and a pruned autotune run
end to end in the interpreter (fake benchmark timings, counted)."""
import pytest
import torch
import triton
import triton.language as tl

from gemm_costmodel.serving import triton_adapter as TA
from gemm_costmodel.kernels.gemm.space import generate_configs
from gemm_costmodel.serving.runtime import DispatchWarning, Dispatcher

from test_runtime import GPU, tiny_model_dir


@pytest.fixture(scope="module")
def disp(tmp_path_factory):
    return Dispatcher(gpu_name=GPU, models_dir=tiny_model_dir(tmp_path_factory))


def test_configs_cover_the_tiled_space():
    cfgs = TA.configs("fp16")
    assert cfgs and all(isinstance(c, triton.Config) for c in cfgs)
    tiled = [c for c in generate_configs("sm90", "fp16") if c.variant == "tiled"]
    assert len(cfgs) == len(tiled)
    got = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.kwargs["GROUP_M"], c.num_warps,
            c.num_stages) for c in cfgs}
    assert got == {(c.block_m, c.block_n, c.block_k, c.group_m, c.num_warps, c.num_stages) for c in tiled}
    assert all(set(c.kwargs) == {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"} for c in cfgs)
    # Other meta-parameter names.
    named = TA.configs("fp16", names={"BM": "block_m", "BN": "block_n", "BK": "block_k"})
    assert all(set(c.kwargs) == {"BM", "BN", "BK"} for c in named)


META = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)


def test_perf_model_returns_a_cached_float(disp, monkeypatch):
    pm = TA.PerfModel(dispatcher=disp)
    a = torch.empty((8, 8), dtype=torch.float16)
    s = pm(M=512, N=4096, K=4096, a=a, **META)
    assert isinstance(s, float)
    calls = []
    real = pm._score
    monkeypatch.setattr(pm, "_score", lambda *args: calls.append(args) or real(*args))
    assert pm(M=512, N=4096, K=4096, a=a, **META) == s
    assert not calls, "a repeated (shape, config) must come from the cache"
    # The dtype is read from the first tensor argument, or given.
    assert TA.PerfModel(dispatcher=disp, dtype="fp16")(M=512, N=4096, K=4096, **META) == s
    # A bigger problem is predicted slower for the same config (log2 latency).
    assert pm(M=8192, N=8192, K=8192, a=a, **META) > s
    # Different configs score differently (the perf model has something to prune with).
    scores = {pm(M=512, N=4096, K=4096, a=a, **dict(META, BLOCK_M=bm, BLOCK_N=bn))
              for bm, bn in ((16, 32), (64, 64), (128, 256))}
    assert len(scores) > 1


def test_perf_model_bad_arguments(disp):
    pm = TA.PerfModel(dispatcher=disp)
    with pytest.raises(ValueError, match="'M'"):
        pm(N=64, K=64, a=torch.empty(1, dtype=torch.float16), **META)
    with pytest.raises(ValueError, match="dtype"):
        pm(M=64, N=64, K=64, a=torch.empty(1, dtype=torch.float32), **META)
    custom = TA.PerfModel(dispatcher=disp, m="rows", n="cols", k="depth", dtype="fp8")
    assert isinstance(custom(rows=64, cols=64, depth=64, **META), float)


def test_perf_model_without_a_model_is_a_roofline():
    d = Dispatcher(gpu_name=GPU, models_dir="/nonexistent/models")
    pm = TA.PerfModel(dispatcher=d, dtype="bf16")
    with pytest.warns(DispatchWarning):
        small = pm(M=128, N=128, K=4096, **META)
    # 4 tiles of 64x64 in one wave: 1 * 64 * 64 * K.
    assert small == 64 * 64 * 4096
    assert pm(M=128, N=128, K=4096, **dict(META, BLOCK_M=128, BLOCK_N=128)) == 128 * 128 * 4096


# -- end to end: a pruned triton.autotune in the interpreter ------------------------------------

@triton.jit
def _matmul_nt(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_cm,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # c (M, N) = a (M, K) @ b (N, K).T in grouped tile order, masked on every edge.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % rows
    pid_n = (pid % group) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k0 * BLOCK_K + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + kk[None, :],
                    mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + offs_n[:, None] * stride_bn + kk[None, :],
                    mask=(offs_n[:, None] < N) & (kk[None, :] < K), other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(tl.float16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


AUTOTUNE_CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 8}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4}, num_warps=4, num_stages=4),
]


def test_autotune_benchmarks_only_the_perf_models_top_k(disp):
    # triton 3.x's Autotuner calls do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8)) once per pruned
    # config and keeps the config of the smallest result. The fake one only counts (the interpreter
    # is slow; the winner's run below checks the result) and reports a time by call order: the
    # second benchmarked config is "faster".
    calls = []

    def fake_do_bench(kernel_call, quantiles=None, **kw):
        assert callable(kernel_call)
        t = 2.0 if not calls else 1.0
        calls.append(t)
        return [t, t, t] if quantiles else t

    pm = TA.PerfModel(dispatcher=disp, dtype="fp16")
    kernel = triton.autotune(configs=AUTOTUNE_CONFIGS, key=["M", "N", "K"],
                             prune_configs_by={"perf_model": pm, "top_k": 2}, do_bench=fake_do_bench)(_matmul_nt)

    # Odd sizes (masked edges) large enough for the tiny model to tell these configs apart.
    M, N, K = 500, 510, 520
    g = torch.Generator().manual_seed(0)
    a = torch.randn((M, K), generator=g).to(torch.float16)
    b = torch.randn((N, K), generator=g).to(torch.float16)
    c = torch.full((M, N), float("nan"), dtype=torch.float16)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    kernel[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0))
    assert len(calls) == 2, "only top_k=2 configs may be benchmarked"
    ref = a.float() @ b.float().T
    assert float(torch.linalg.norm(c.float() - ref) / torch.linalg.norm(ref)) < 2e-3

    # The benchmarked configs are the perf model's two best, and the fake-fastest one won.
    scores = [pm(M=M, N=N, K=K, **cfg.all_kwargs()) for cfg in AUTOTUNE_CONFIGS]
    top2 = sorted(AUTOTUNE_CONFIGS, key=lambda cfg: scores[AUTOTUNE_CONFIGS.index(cfg)])[:2]
    assert sorted(scores)[1] < sorted(scores)[2], "the model must separate its top 2 from the rest"
    assert top2 != AUTOTUNE_CONFIGS[:2], "pruning must not be the list order"
    assert set(kernel.configs_timings) == set(top2)
    assert kernel.best_config is top2[1]

    # The decision is cached under the tuning key (M, N, K and the tensor dtypes).
    assert list(kernel.cache.values()) == [top2[1]]
