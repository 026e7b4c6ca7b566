"""Where torch._grouped_mm (the MoE op's vendor candidate) runs and is correct on this stack:
one JSON line per probe problem (run, error, relative error vs the fp32 reference).
Each problem runs in a child process, so a lost CUDA context only loses that probe.

    python benchmarks/explore/moe_vendor_probe.py > probe.jsonl
"""
import json
import multiprocessing as mp
import sys

PROBLEMS = [
    # (m, n, k, e, top_k, stage, routing)
    (1, 2 * 768, 2048, 128, 8, "gate_up", "balanced"),  # most experts get no token
    (7, 4096, 768, 128, 8, "down", "zipf"),
    (64, 2 * 1408, 2048, 64, 6, "gate_up", "zipf"),
    (256, 2048, 1408, 64, 6, "down", "hot"),
    (1000, 2 * 1792, 4096, 8, 2, "gate_up", "balanced"),
    (4097, 4096, 1792, 8, 2, "down", "real0"),
    (33, 2 * 120, 200, 512, 10, "gate_up", "zipf"),  # E = 512, N and K multiples of 8 only
    (16, 2 * 100, 2056, 16, 2, "gate_up", "balanced"),
]


def _one(args, q):
    try:
        import torch

        from gemm_costmodel.kernels.moe import impl, space
        m, n, k, e, top_k, stage, routing = args
        p = space.Problem(m, n, k, "bf16", e, top_k, stage, routing)
        gen = torch.Generator(device="cuda").manual_seed(0)
        ops = impl.make_operands(p, "cuda", gen)
        ref = impl.reference(ops)
        y = ops.run(space.VENDOR)
        torch.cuda.synchronize()
        err = (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item()
        q.put({"ok": True, "rel_err": err})
    except Exception as exc:  # noqa: BLE001 - the probe records every failure
        q.put({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})


def main():
    ctx = mp.get_context("spawn")
    for args in PROBLEMS:
        q = ctx.Queue()
        proc = ctx.Process(target=_one, args=(args, q))
        proc.start()
        proc.join(300)
        res = q.get() if not q.empty() else {"ok": False, "error": f"child exit code {proc.exitcode}"}
        keys = ("m", "n", "k", "e", "top_k", "stage", "routing")
        print(json.dumps({**dict(zip(keys, args)), **res}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
