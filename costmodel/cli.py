"""`costmodel` command line: benchmark sweeps, the dataset, and the cost model
(train, evaluate, export; `run` does all three on the shipped data)."""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import time


# The --dtype choices of every command (an op takes a subset: _check_op_dtypes). fp8bs: the MoE op's
# block-scaled fp8 (128x128 weight scales, 1x128 activation scales).
DTYPE_CHOICES = ["bf16", "fp16", "fp8", "fp8bs"]


def _fail(msg: str) -> int:
    print(f"costmodel: error: {msg}", file=sys.stderr)
    return 2


def _default_dtype(op: str) -> str:
    """The dtype a command uses for an op when none is given: the first the op accepts (registry
    ``dtypes``: bf16 for gemm and moe, fp8 for fp8_blockscale, which takes nothing else)."""
    from gemm_costmodel import registry

    return registry.get(op).dtypes[0]


def _check_op_dtypes(op: str, dtypes) -> None:
    """ValueError naming the dtypes the op accepts when one of ``dtypes`` is not among them."""
    from gemm_costmodel import registry

    accepted = registry.get(op).dtypes
    for d in dtypes:
        if d not in accepted:
            raise ValueError(f"op {op} does not take dtype {d}; it takes: {', '.join(accepted)}")


def _shapes_from_args(args):
    from gemm_costmodel import registry
    from gemm_costmodel.kernels import shapes as S

    spec = registry.get(args.op)
    out = []
    for dtype in args.dtype or [_default_dtype(args.op)]:
        if args.shapes:
            # Every problem field the op declares (MoE: E, top_k, stage, routing), read as the op's
            # problems, so a user's shapes take the same harness path as a suite's.
            out += [s for s in S.read_problem_csv(args.shapes, args.op, default_dtype=dtype)
                    if s.dtype == dtype or len(args.dtype or ()) <= 1]
        else:
            out += spec.suite(args.suite, dtype)
    out = list(dict.fromkeys(out))
    if getattr(args, "only", None):
        # Re-measuring chosen shapes of a suite keeps their origins (and so their family).
        listed = S.read_shape_csv(args.only)
        # Columns of the ops' own string fields narrow it further (an MoE re-measure of one stage:
        # the shape keys of two stages can coincide, e.g. a down N x K and a gate_up 2I x K).
        cols, values, has_dtype = _only_fields(args.only)
        # A list without a dtype column names shapes of every selected dtype: read as bf16 it
        # matched nothing of an fp8 sweep (the H200's fp8 decode rows, issue 63).
        dt = (lambda s: s.dtype) if has_dtype else (lambda s: "")
        wanted = {(s.m, s.n, s.k, dt(s), *v) for s, v in zip(listed, values)}
        out = [s for s in out if (s.m, s.n, s.k, dt(s), *(str(getattr(s, c, "")) for c in cols)) in wanted]
        if not out:
            raise ValueError(f"{args.only}: none of its shapes is in the selected suite and dtypes")
    if args.limit:
        out = out[: args.limit]
    return out


def _only_fields(path: str) -> tuple[list[str], list[tuple], bool]:
    """(columns, their values row by row: read_shape_csv's rows, whether it has a dtype column) of
    an --only CSV's columns that name an op's string problem field (registry.str_columns(), e.g.
    MoE's stage)."""
    import csv

    from gemm_costmodel import registry

    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        have = {c.strip().lower(): c for c in (reader.fieldnames or [])}
        cols = [c for c in registry.str_columns() if c in have]
        return cols, [tuple(r[have[c]].strip() for c in cols) for r in reader], "dtype" in have


def cmd_bench(args) -> int:
    import torch

    from gemm_costmodel import registry
    from gemm_costmodel.benchmarks import harness, precompile, provenance
    from gemm_costmodel.kernels import timing
    from gemm_costmodel.benchmarks.store import ResultStore

    try:
        shard = harness.parse_shard(args.shard)
        shapes = _shapes_from_args(args)
    except (OSError, ValueError) as exc:
        return _fail(str(exc))
    if args.devices and args.devices > 1:
        return _spawn_per_device(args)
    if not torch.cuda.is_available():
        return _fail("no CUDA device: `costmodel bench` measures on a GPU")
    mine = harness.shard_shapes(shapes, shard)
    # Seeded shuffle: a run cut short by --time-budget covers families and M evenly
    # rather than the first (N, K) pairs; the resume skips what is stored either way.
    random.Random(args.seed).shuffle(mine)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.name}-shard{shard[0]:02d}of{shard[1]:02d}.jsonl")
    prov = provenance.collect(torch.cuda.current_device())
    timer = timing.GraphTimer() if args.timer == "graph" else timing.DoBenchTimer()
    stop_on_sigterm()
    # Per shape, as it finishes: status counts, seconds, reserved/allocated device memory.
    log_path = path[: -len(".jsonl")] + ".shapes.log"

    def log_shape(shape, info):
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(info["log"]) + "\n")

    try:
        with ResultStore(path) as store:
            if args.precompile:
                spec = registry.get(args.op)
                todo = []
                for s in mine:
                    p = harness.shape_problem(spec, s)
                    # Only what this run will measure: a resumed sweep recompiled every candidate of
                    # every shape (200 s on a fresh machine for the MoE gate's last 135 rows).
                    cands = [c for c in harness.select_candidates(p, args.mode, args.seed, args.arch, op=args.op)
                             if not store.done(harness.key_of(args.op, s, c.id))]
                    if cands:
                        todo.append((p, cands))
                precompile.precompile(todo, workers=args.workers, log=lambda m: print(m, file=sys.stderr),
                                      op=args.op)
            stats = harness.run_sweep(mine, store, timer, mode=args.mode, seed=args.seed, arch=args.arch,
                                      provenance=prov, suite=args.name, progress=not args.quiet,
                                      time_budget_s=args.time_budget or None, on_shape=log_shape, op=args.op)
    except KeyboardInterrupt:
        print(f"costmodel: stopped; {path} keeps every finished row, rerun the same command to resume",
              file=sys.stderr)
        return 130
    print(harness.format_health(stats), file=sys.stderr)
    print(json.dumps({"file": path, "shape_log": log_path, "shapes": stats.shapes, "measured": stats.measured,
                      "skipped": stats.skipped, "failed": stats.failed, "statuses": dict(stats.statuses),
                      "skipped_shapes": stats.skipped_shapes, "unhealthy_shapes": stats.unhealthy,
                      "memory": stats.memory_summary(),
                      "seconds": round(stats.seconds, 1), "measurements_per_s": round(stats.rate, 1),
                      "stopped_early": stats.stopped_early,
                      "phase_seconds": {k: round(v, 1) for k, v in stats.phase_seconds.items()}}))
    return 0


def stop_on_sigterm() -> None:
    """Make SIGTERM (``timeout``, a job scheduler) stop a sweep the way Ctrl-C does.

    The sweep then clears its in-flight marker, so the resume measures the
    interrupted candidate again instead of recording it as a crash.
    """
    import signal

    def _raise(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def _spawn_per_device(args) -> int:
    """One process per GPU, each taking one shard of args.shard's range."""
    i0, n0 = (int(v) for v in args.shard.split("/"))
    if n0 != 1:
        return _fail("--devices splits the work itself; use it with --shard 0/1")
    procs = []
    for d in range(args.devices):
        cmd = [sys.executable, "-m", "gemm_costmodel.cli"] + [a for a in sys.argv[1:]]
        cmd = _replace_opt(cmd, "--shard", f"{d}/{args.devices}")
        cmd = _replace_opt(cmd, "--devices", "1")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(d))
        procs.append(subprocess.Popen(cmd, env=env))
    return max(p.wait() for p in procs)


def _replace_opt(cmd, opt, value):
    if opt in cmd:
        i = cmd.index(opt)
        return cmd[: i + 1] + [value] + cmd[i + 2:]
    return cmd + [opt, value]


def cmd_summarize(args) -> int:
    from gemm_costmodel.benchmarks import summary

    paths = []
    for pat in args.results:
        hits = sorted(glob.glob(pat)) if any(ch in pat for ch in "*?[") else [pat]
        paths += hits
    if not paths:
        return _fail("no result files match " + " ".join(args.results))
    for p in paths:
        if not os.path.isfile(p):
            return _fail(f"result file not found: {p}")
    from gemm_costmodel.benchmarks.store import RowsError

    try:
        df = summary.load_rows(paths)
        text = summary.summarize(df, copy_gbps=args.copy_gbps)
    except RowsError as exc:
        return _fail(f"cannot summarize: {exc}")  # the message names the file (and line)
    except (ValueError, KeyError) as exc:
        return _fail(f"cannot summarize {', '.join(paths)}: {exc}")
    print(text)
    return 0


def cmd_configs(args) -> int:
    from collections import Counter

    from gemm_costmodel import registry

    spec = registry.get(args.op)
    dtypes = args.dtype or list(spec.dtypes)
    try:
        _check_op_dtypes(args.op, dtypes)
        spaces = [(dtype, spec.configs(args.arch, dtype)) for dtype in dtypes]
    except ValueError as exc:  # a dtype the op refuses, an unknown arch
        return _fail(str(exc))
    for dtype, cfgs in spaces:
        by = Counter(c.variant for c in cfgs)
        print(f"{args.op} {args.arch} {dtype}: {len(cfgs)} candidates ({', '.join(f'{k} {v}' for k, v in by.items())})")
    return 0


def cmd_dataset(args) -> int:
    from gemm_costmodel.data import dataset as D

    try:
        if args.action == "build":
            # The default patterns take what `costmodel bench` writes there (plain .jsonl) and the
            # committed, gzipped shards; a default pattern matching nothing is no error, a given one is.
            given = args.raw is not None
            raws = sorted(p for pat in (args.raw or RAW_SHARDS) for p in (glob.glob(pat) or ([pat] if given else [])))
            if not given:
                raws = _without_gzipped_twins(raws)
            if not raws:
                return _fail("no raw shard files given")
            for path in D.build_parquet(raws, args.root, log=lambda msg: print(msg, file=sys.stderr)):
                print(path)
            return 0
        paths = args.files or None
        if args.action == "validate":
            return _validate_dataset(paths, args.root)
        df = D.load_dataset(paths, root=args.root)
        from gemm_costmodel.data import datacard

        rem = None
        if args.remeasure:
            import pandas as pd

            from gemm_costmodel.benchmarks.store import read_rows

            files = sorted(p for pat in args.remeasure for p in glob.glob(pat))
            # Strict, like the dataset: a truncated file is an error naming it, not a traceback.
            rem = pd.DataFrame(read_rows(files, strict=True)) if files else None
        print(datacard.card(df, rem))
        return 0
    except (OSError, ValueError) as exc:
        return _fail(str(exc))


# Where `costmodel bench` writes its shards (--out) and what `costmodel dataset build` reads by default.
RAW_DIR = os.path.join("datasets", "raw")
RAW_SHARDS = [os.path.join(RAW_DIR, "*-shard*.jsonl.gz"), os.path.join(RAW_DIR, "*-shard*.jsonl")]


def _without_gzipped_twins(paths: list) -> list:
    """The shards, less a .jsonl.gz whose plain .jsonl is there too: a committed shard unpacked and
    resumed by `costmodel bench` (the .jsonl holds the old rows and the new; reading both would
    count the old rows twice and write one parquet stem twice)."""
    have = set(paths)
    return [p for p in paths if not (p.endswith(".jsonl.gz") and p[:-3] in have)]


def _validate_dataset(paths, root: str) -> int:
    """`dataset validate`: the schema of every file, then each op's fields, candidate ids, values and
    conflicting duplicates on the raw rows (data.checks); exit 2 with every problem listed, or "ok"
    with the problems counted per op by the op's full key (MoE: E, top_k, stage and routing too)."""
    import pandas as pd

    from gemm_costmodel.data import checks
    from gemm_costmodel.data import dataset as D

    paths = list(paths) if paths is not None else D.dataset_files(root)
    if not paths:
        raise D.DataError(f"{root}: no data files")
    raw = pd.concat([D.read_file(str(p)) for p in paths], ignore_index=True)
    errors = checks.check_rows(raw)
    if errors:
        for e in errors:
            print(f"costmodel: error: {e}", file=sys.stderr)
        return 2
    rows = len(D.merge_duplicates(D.demote_oom_eval_shapes(raw)[0]))
    counts = checks.problem_counts(raw)
    print(f"ok: {rows} rows, {sum(counts.values())} shapes (problems by each op's full key: "
          + ", ".join(f"{op} {n}" for op, n in counts.items()) + f"), schema {D.schema_hash()}")
    return 0


def cmd_import(args) -> int:
    import pandas as pd

    from gemm_costmodel.data import importers as I
    from gemm_costmodel.data.dataset import DataError

    try:
        if args.format == "csv":
            frames = [I.import_csv(p) for p in args.files]
        else:
            if not args.hidden or args.hidden <= 0:
                return _fail("vLLM tables do not record the hidden size K: pass --hidden K")
            frames = [I.import_vllm(p, args.hidden, args.top_k) for p in args.files]
    except (DataError, OSError) as exc:
        return _fail(str(exc))
    df = pd.concat(frames, ignore_index=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    df.to_parquet(args.out, index=False, compression="zstd")
    print(f"imported {len(df)} rows from {len(frames)} file(s) into {args.out} "
          f"(arch: {', '.join(sorted(df['arch'].astype(str).unique()))})")
    return 0


# -- cost model -----------------------------------------------------------------

def _int_tuple(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4), for argparse (it names the option on a ValueError)."""
    return tuple(int(v) for v in text.split(","))


def _train_config(args):
    from gemm_costmodel import registry
    from gemm_costmodel.learning.model import TrainConfig

    # The command line, else the op's own defaults (registry ``train_defaults``), else TrainConfig's.
    own = registry.get(args.op).train_defaults

    def pick(arg: str, field: str):
        v = getattr(args, arg, None)
        return v if v is not None else own.get(field, getattr(TrainConfig, field))

    return TrainConfig(formulation=pick("formulation", "formulation"), n_estimators=pick("trees", "n_estimators"),
                       max_depth=pick("depth", "max_depth"), learning_rate=pick("eta", "learning_rate"),
                       n_jobs=args.jobs, seed=args.seed, eval_weight=pick("eval_weight", "eval_weight"),
                       shortlist_tol=pick("shortlist_tol", "shortlist_tol"),
                       shortlist_edges=pick("shortlist_edges", "shortlist_edges"),
                       vendor_margin=pick("vendor_margin", "vendor_margin"),
                       parallel_trees=pick("parallel_trees", "parallel_trees"),
                       n_seeds=pick("n_seeds", "n_seeds"),
                       rank_step=pick("rank_step", "rank_step"),
                       decode_weight=pick("decode_weight", "decode_weight"),
                       decode_max_m=pick("decode_max_m", "decode_max_m"),
                       split_m=pick("split_m", "split_m"),
                       split_high_rows=pick("split_high_rows", "split_high_rows"),
                       split_low_rows=pick("split_low_rows", "split_low_rows"),
                       split_low_weight=pick("split_low_weight", "split_low_weight"),
                       weight_gpu=pick("weight_gpu", "weight_gpu"),
                       gpu_weight=pick("gpu_weight", "gpu_weight"))


def _stage(args, what: str) -> None:
    """One labelled progress line per long step, with the time since the command started: the
    main job runs for minutes, and a silent step reads as a hang."""
    t0 = getattr(args, "_t0", None)
    if t0 is None:
        t0 = args._t0 = time.perf_counter()
    s = int(time.perf_counter() - t0)
    print(f"[{s // 60}:{s % 60:02d}] {what}", flush=True)


def _load_frame(args):
    _stage(args, f"data: loading {', '.join(args.data) if args.data else args.root + '/'} ({args.op} rows; "
                 "imports and parquet reading take about half a minute)")
    from gemm_costmodel.learning.pipeline import load_training_frame

    return load_training_frame(args.data or None, root=args.root, dtypes=args.dtype, arch=args.arch,
                               gpus=args.gpu, op=args.op, log=lambda msg: print(msg, file=sys.stderr))


def _config_and_frame(args):
    """(TrainConfig, data frame, 0) from the shared model options, or (None, None, exit code) after a
    one-line error (bad hyperparameters, missing file, wrong schema, no rows, a --weight-gpu that no
    row was measured on: matched exactly, it would weigh nothing)."""
    from gemm_costmodel.data.dataset import DataError

    try:
        cfg, df = _train_config(args), _load_frame(args)
    except (DataError, OSError, ValueError) as exc:
        return None, None, _fail(str(exc))
    if cfg.weight_gpu and cfg.weight_gpu not in set(df["gpu_name"].astype(str)):
        return None, None, _fail(f"--weight-gpu {cfg.weight_gpu!r}: no row of that gpu_name (the data's: "
                                 + ", ".join(sorted(set(df["gpu_name"].astype(str)))) + ")")
    return cfg, df, 0


def _save_booster(model, df, path: str) -> None:
    from gemm_costmodel.learning.export import data_hash

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    model.booster_.save_model(path)
    side = {"config": model.params(), "n_rows": model.n_rows_, "n_shapes": model.n_shapes_,
            "schema_hash": model.schema_hash_, "dtypes": sorted(df["dtype"].unique()),
            "shortlist": {str(b): ids for b, ids in (model.shortlist_ or {}).items()},
            "gpus": sorted(df["gpu_name"].unique()), "training_data_hash": data_hash(df)}
    with open(path + ".train.json", "w", encoding="utf-8") as fh:
        json.dump(side, fh, indent=1)


def _shipped_models_dirs() -> set[str]:
    """The folders the runtime serves the shipped models from (the installed package's models/)."""
    from gemm_costmodel.serving.runtime import DEFAULT_MODELS_DIR

    out = {os.path.realpath(DEFAULT_MODELS_DIR)}
    try:
        import gemm_costmodel.models as pkg

        out.add(os.path.realpath(os.path.dirname(os.path.abspath(pkg.__file__))))
    except ImportError:  # pragma: no cover - the package always ships models/
        pass
    return out


def _writable_dir(path: str) -> str | None:
    """None when files can be created in folder ``path`` (made if missing), else why not. Tried by
    writing a file, not with os.access: that says yes to root on a read-only mount."""
    import tempfile

    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".costmodel-write-check-"):
            pass
    except OSError as exc:
        return f"{path}: cannot write there ({exc.strerror or exc})"
    return None


def _check_train_outputs(args) -> str | None:
    """Before any training: where ``train`` would write must be given, must not be the shipped
    models unless --force says so, and must be writable. An error message, or None."""
    outputs = []
    if not args.no_export:
        if args.out is None:
            return "give --out DIR, the folder for the new model (the shipped models/ folder only with --force)"
        # `run` has no --force (its output folder is its own concern); train's is False unless given.
        if getattr(args, "force", True) is False and os.path.realpath(args.out) in _shipped_models_dirs():
            return (f"--out {args.out} is the shipped models folder: training would replace a shipped model; "
                    "pass --force to do that, or give another --out")
        outputs.append(args.out)
    if args.booster:
        outputs.append(os.path.dirname(os.path.abspath(args.booster)))
    for folder in outputs:
        why = _writable_dir(folder)
        if why:
            return why
    return None


def cmd_train(args) -> int:
    from gemm_costmodel.learning import pipeline

    problem = _check_train_outputs(args)
    if problem:
        return _fail(problem)
    cfg, df, err = _config_and_frame(args)
    if err:
        return err
    if getattr(args, "train_gpu", None):
        # run --train-gpu: the final model learns from the same GPUs' rows as the held-out folds did.
        df = df[df["gpu_name"].astype(str).isin(args.train_gpu)]
        if df.empty:
            return _fail(f"--train-gpu: no rows of {', '.join(args.train_gpu)} in the data")
    try:
        # Too little data to learn from would still give a model, and replace a good one.
        least = getattr(args, "min_problems", None)
        pipeline.check_enough_data(df, cfg, pipeline.MIN_PROBLEMS_PER_DTYPE if least is None else least)
    except ValueError as exc:
        return _fail(f"cannot train: {exc}")
    try:
        # Data that passed validation can still give nothing to learn (no stable row of a
        # dtype, no shape with two candidates): the model code says so with a ValueError.
        _stage(args, f"train: the final {cfg.formulation} model on every row")
        model = pipeline.train(df, cfg)
        lat = None
        if not args.no_export and cfg.formulation != "log_latency" and args.latency_model:
            _stage(args, "train: the latency companion (log-latency regression; rank() shows its estimates)")
            lat = pipeline.train(df, pipeline.LATENCY_COMPANION.with_(n_jobs=cfg.n_jobs, seed=cfg.seed))
    except ValueError as exc:
        return _fail(f"cannot train: {exc}")
    if args.booster:
        _save_booster(model, df, args.booster)
        print(f"booster: {args.booster}")
    if not args.no_export:
        _stage(args, f"export: the decision model to ONNX in {args.out} (conversion takes about half a minute)")
        pipeline.export_model(model, df, args.out, arch=args.arch, metrics=getattr(args, "metrics_out", None))
        from gemm_costmodel.serving.runtime import model_name

        companion = os.path.join(args.out, model_name(args.op, args.arch, "latency"))
        if lat is not None:
            # rank() reports predicted latencies: a small log-latency model annotates the top k.
            _stage(args, f"export: the latency companion to ONNX in {args.out}")
            pipeline.export_model(lat, df, args.out, arch=args.arch, role="latency")
        else:
            for ext in (".onnx", ".json"):
                if os.path.exists(companion + ext):
                    os.remove(companion + ext)  # a stale companion would mislabel the new model's picks
    return 0


def cmd_export(args) -> int:
    from gemm_costmodel.learning import export as X
    from gemm_costmodel.learning.model import CostModel, TrainConfig

    side_path = args.booster + ".train.json"
    for p in (args.booster, side_path):
        if not os.path.isfile(p):
            return _fail(f"{p}: no such file (write it with `costmodel train --booster {args.booster}`)")
    try:
        import xgboost as xgb

        with open(side_path, encoding="utf-8") as fh:
            side = json.load(fh)
        model = CostModel(TrainConfig(**side["config"]))
        model.booster_ = xgb.Booster()
        model.booster_.load_model(args.booster)
        model.n_rows_, model.n_shapes_ = side["n_rows"], side["n_shapes"]
        model.shortlist_ = {int(b): ids for b, ids in (side.get("shortlist") or {}).items()} or None
        from gemm_costmodel.serving import features as F

        if side["schema_hash"] != F.schema_hash(args.op):
            return _fail(f"{args.booster}: feature schema {side['schema_hash']} != this code's "
                         f"{F.schema_hash(args.op)} for op {args.op}; retrain")
    except (OSError, ValueError, KeyError, TypeError, xgb.core.XGBoostError) as exc:
        return _fail(f"{args.booster}: unreadable booster: {exc}")
    spaces = X.space_hashes(args.op, args.arch, side["dtypes"])
    onnx_path, man = X.export(model, args.out, args.op, side["dtypes"], args.arch, spaces,
                              side["training_data_hash"], gpus=side["gpus"])
    print(f"export: {onnx_path}, manifest {man}")
    return 0


# What a --sampled-heldout figure is measured against (the report's header, the manifest's metrics).
SAMPLED_ORACLE = "best measured of each problem's sampled candidates, not the full space"


def _report_header(df, cfg, sampled: bool = False) -> str:
    from gemm_costmodel.learning.evaluate import sampled_mask
    from gemm_costmodel.learning.model import shape_cols

    held = sampled_mask(df) if sampled else df["eval_shape"].astype(bool)
    # Sampled: distinct problems by the op's full key (a vllm_moe layer's experts and routing too); the
    # fully measured count keeps its (GPU, dtype, M, N, K) key, so the committed reports rebuild unchanged.
    counts = df[held].drop_duplicates(shape_cols(df) if sampled else ["gpu_name", "dtype", "m", "n", "k"])
    c = counts.groupby(["gpu_name", "dtype"]).size()
    lines = [f"Model: {cfg.formulation}, {cfg.n_estimators} trees of depth {cfg.max_depth}, eta "
             f"{cfg.learning_rate}, seed {cfg.seed}; trained on stable ok rows only.",
             "Evaluation shapes: " + ", ".join(f"{g} {d}: {n}" for (g, d), n in c.items()) + ".\n"]
    if sampled:
        from gemm_costmodel.learning.glance import SAMPLED_MARK

        # The mark is how the README table (glance) knows to leave this report out.
        lines.insert(1, f"{SAMPLED_MARK}: problems measured on a sample of their candidates, "
                        f"\"oracle\" = the {SAMPLED_ORACLE}; a baseline whose config was not measured "
                        "on a problem takes the fallback rule's nearest measured candidate there.")
    return "\n".join(lines) + "\n"


def cmd_evaluate(args) -> int:
    from gemm_costmodel.learning import pipeline, report

    cfg, df, err = _config_and_frame(args)
    if err:
        return err
    sampled = getattr(args, "sampled_heldout", False)
    if not sampled and not df["eval_shape"].astype(bool).any():
        return _fail("no evaluation shapes in the data: evaluation needs shapes measured with --mode all "
                     "(or --sampled-heldout: hold out the sampled problems, against their best measured candidate)")
    comparison = None
    try:
        # A fold with nothing to learn from (data that passed validation, but e.g. no
        # stable row outside the held-out family) raises ValueError in the model code.
        if args.compare:
            comparison = pipeline.compare(df, cfg, train_gpus=args.train_gpu, sampled=sampled)
            if args.select:
                best = pipeline.select_best(comparison)
                print(f"evaluate: best on validation: {best}")
                cfg = cfg.with_(**best)
        _stage(args, f"evaluate: held-out folds ({', '.join(args.schemes)}), a model trained per fold")
        res = pipeline.evaluate(df, cfg, schemes=args.schemes, train_gpus=args.train_gpu, sampled=sampled)
        fam, nk = res.get("family", (None, None))[0], res.get("nk", (None, None))[0]
        cards = {s: res[s][0] for s in ("card", "card_adapt") if s in res}
        # The headline scheme (plots, manifest metrics, the printed table): the first of these run.
        lead = next(s for s in ("family", "nk", "card", "card_adapt") if s in res)
        rows = res[lead][1]
        if cfg.formulation != "log_latency" and rows is not None and not args.latency_model:
            rows = None  # a rank score is no latency: without the companion, no predicted-vs-measured plot
        elif cfg.formulation != "log_latency" and rows is not None:
            # Rank/normalized scores are not latencies: the predicted-vs-measured plot shows the
            # held-out predictions of the latency companion instead.
            from gemm_costmodel.learning.evaluate import cross_validate

            lat_cfg = pipeline.LATENCY_COMPANION.with_(n_jobs=cfg.n_jobs, seed=cfg.seed)
            _stage(args, "evaluate: the latency companion's held-out predictions (for the predicted-vs-measured plot)")
            rows = cross_validate(df, lat_cfg, scheme=lead, baselines=False,
                                  train_gpus=args.train_gpu, log=pipeline._print, sampled=sampled)[1]
    except ValueError as exc:
        return _fail(f"cannot evaluate: {exc}")
    from gemm_costmodel import registry
    from gemm_costmodel.learning.evaluate import adaptation_rows

    main = res[lead][0]
    _stage(args, f"report: tables and plots to {args.report}")
    sections = registry.get(args.op).report_sections(main[main["gpu_name"].notna()]) if fam is not None or nk is not None else []
    if cards:
        adapted = df[adaptation_rows(df)].groupby("gpu_name").size().to_dict()
        sections = [report.card_section(cards, fam, adapted), *sections]
    curve = _curve_file(args)
    if curve:
        sections.append(report.curve_section(curve, args.report))
    path = report.write_report(args.report, fam, nk, rows, comparison, header=_report_header(df, cfg, sampled),
                               extra_sections=sections, cards=cards, sampled=sampled)
    from gemm_costmodel.learning.evaluate import metrics_table

    if getattr(args, "metrics_out", None) is not None:
        from gemm_costmodel.learning.pipeline import model_metrics

        metrics = model_metrics(main)
        if sampled:
            # Not comparable with a full-space oracle's figures: the manifest says against what.
            metrics = {key: {**m, "oracle": SAMPLED_ORACLE} for key, m in metrics.items()}
        args.metrics_out.update(metrics)
    m = metrics_table(main, by=["gpu_name", "dtype"])
    cols = ["method", "gpu_name", "dtype", "shapes", "match_2pct", "geomean_slowdown", "p99_slowdown",
            "top8_bench_slowdown"]
    from gemm_costmodel.util import markdown_table

    print(markdown_table(report._fmt(m[cols])))
    print(f"report: {path}")
    return 0


RUN_OUT = "costmodel-run"  # the default work folder of `costmodel run` (git-ignored)


def _written_since(folders, t0: float) -> list[str]:
    """Files under ``folders`` modified at or after ``t0`` (wall clock), sorted, each once."""
    out = set()
    for folder in folders:
        for root, _, files in os.walk(folder):
            for f in files:
                path = os.path.join(root, f)
                if os.path.getmtime(path) >= t0:
                    out.add(os.path.normpath(path))
    return sorted(out)


def cmd_run(args) -> int:
    """The main job: held-out evaluation + report, then the final model, exported
    with the held-out metrics in its manifest. Writes into a work folder (``--out``, default
    ./costmodel-run/), never over the shipped models/ unless told to, and lists what it wrote."""
    from gemm_costmodel import registry

    if args.report is None:
        # The same layout as the shipped reference (models/report/, models/report/<op>/), so the
        # two can be compared file by file.
        args.report = os.path.join(args.out, "report", *([] if args.op == registry.DEFAULT_OP else [args.op]))
    args.metrics_out = {}
    wall0 = time.time() - 1  # mtime granularity: a file written in the first second still counts
    _stage(args, f"run: {args.op}: evaluate held out, write the report to {args.report}, then train and export "
                 f"the model to {args.out}")
    rc = cmd_evaluate(args)
    if rc:
        return rc
    rc = cmd_train(args)
    if rc:
        return rc
    written = _written_since([args.out, args.report], wall0)
    _stage(args, f"run: done; wrote {len(written)} files:")
    for path in written:
        print(f"  {path} ({os.path.getsize(path) / 1e3:,.0f} kB)")
    shipped = os.path.join("models", "report", *([] if args.op == registry.DEFAULT_OP else [args.op]), "report.md")
    if os.path.isfile(shipped) and os.path.abspath(args.report) != os.path.abspath(os.path.dirname(shipped)):
        print(f"the shipped reference: diff {os.path.join(args.report, 'report.md')} {shipped}")
    return 0


def cmd_adapt(args) -> int:
    """Model-guided measurement rounds on this machine's GPU, each followed by a retrain."""
    from gemm_costmodel import adapt as A
    from gemm_costmodel import registry

    if args.plan:
        # Plan the next round on any machine; a GPU campaign measures it (docs/adapting.md).
        if not args.gpu:
            return _fail("--plan needs --gpu NAME: the card the round is for")
        try:
            cfg = A.AdaptConfig(op=args.op, gpu_name=args.gpu, out=args.out, dtypes=tuple(args.dtype or ()),
                                problems_per_round=args.problems, top=args.top, seed=args.seed,
                                data_root=args.root, models=args.models, jobs=args.jobs)
            planned = A.plan_round(cfg)
        except (OSError, ValueError, RuntimeError) as exc:
            return _fail(str(exc))
        for p in planned:
            print("costmodel bench " + " ".join(p["bench_args"]))
        return 0
    try:
        import torch

        if not torch.cuda.is_available():
            return _fail("no CUDA device: `costmodel adapt` measures on the GPU it adapts to")
        gpu = args.gpu or torch.cuda.get_device_name()
        cfg = A.AdaptConfig(op=args.op, gpu_name=gpu, out=args.out, dtypes=tuple(args.dtype or ()),
                            minutes=args.minutes, problems_per_round=args.problems, top=args.top,
                            seed=args.seed, data_root=args.root, models=args.models, jobs=args.jobs)
        state = A.adapt(cfg)
    except (OSError, ValueError, RuntimeError) as exc:
        return _fail(str(exc))
    print(json.dumps({"out": args.out, "models": os.path.join(args.out, "models"), "rounds": len(state.rounds),
                      "rows": sum(r["rows"] for r in state.rounds), "device_minutes": round(state.device_s / 60, 2)}))
    if args.heldout:
        paths = A.base_parquet(registry.get(args.op), args.root, cfg.dtypes) + sorted(
            glob.glob(os.path.join(args.out, "datasets", "**", "*.parquet"), recursive=True))
        for dtype, s in A.heldout_on_card(args.op, gpu, paths, jobs=args.jobs, log=print).items():
            print(f"held out on {gpu}, {dtype}: {s['shapes']} shapes, geomean {s['geomean_slowdown']:.4f}, "
                  f"within 2% {100 * s['match_2pct']:.1f}%, p99 {s['p99_slowdown']:.3f}")
    return 0


def _missing_select_fields(args) -> str | None:
    """The first problem field of the op beyond (M, N, K, dtype, E, top_k) that its Problem has no
    default for and the command line left out (e.g. MoE's stage)."""
    import dataclasses

    from gemm_costmodel import registry

    spec = registry.get(args.op)
    fields = {f.name: f for f in dataclasses.fields(spec.space_module().Problem)}
    for name in spec.extra_problem_fields():
        f = fields.get(name)
        needed = f is not None and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if needed and getattr(args, name, None) is None:
            return name
    return None


def _problem_field_args(q) -> None:
    """An option per problem field the ops declare beyond (M, N, K, dtype) (registry.columns():
    e.g. --e, --top-k, --stage, --routing), its help naming the ops that take it."""
    import dataclasses

    from gemm_costmodel import registry

    docs = registry.columns()
    for c in registry.extra_columns():
        kind = registry.column_kind(c)
        takers = []
        for spec in registry.REGISTRY.values():
            if c not in spec.problem_fields:
                continue
            f = {x.name: x for x in dataclasses.fields(spec.space_module().Problem)}.get(c)
            needed = (kind == "str" and f is not None and f.default is dataclasses.MISSING
                      and f.default_factory is dataclasses.MISSING)
            default = f" (default {f.default})" if f is not None and f.default is not dataclasses.MISSING else ""
            takers.append(f"{'required with ' if needed else ''}--op {spec.name}{default}")
        doc = docs[c][1] if c in docs else c
        if kind == "int":
            q.add_argument(f"--{c.replace('_', '-')}", type=int, default=registry.column_default(c),
                           help=f"{doc}; {', '.join(takers)}")
        else:
            q.add_argument(f"--{c.replace('_', '-')}", default=None, help=f"{doc}; {', '.join(takers)}")


def cmd_select(args) -> int:
    """Print the dispatcher's decision (or top k) for one problem."""
    import warnings

    from gemm_costmodel import registry
    from gemm_costmodel.serving.runtime import Dispatcher

    dtype = args.dtype or _default_dtype(args.op)
    try:
        _check_op_dtypes(args.op, [dtype])
        missing = _missing_select_fields(args)
    except ValueError as exc:
        return _fail(str(exc))
    if missing:
        return _fail(f"op {args.op} needs the problem field {missing!r}: give --{missing.replace('_', '-')}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:  # a bad --gpu or COSTMODEL_GPU_SPECS fails at construction, a bad problem at rank
            d = Dispatcher(gpu_name=args.gpu, models_dir=args.models, op=args.op)
            # The ops' own problem fields (registry.extra_columns(): options of their names); the
            # integers always (a dense GEMM's values by default), the strings when given.
            ints, strs = registry.key_layout()
            extra = {f: getattr(args, f) for f in strs if getattr(args, f, None) is not None}
            choices = d.rank(args.m, args.n, args.k, dtype, count=args.top, **{f: getattr(args, f) for f in ints},
                             **extra)
        except ValueError as exc:
            return _fail(str(exc))
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    for i, c in enumerate(choices, 1):
        lat = f"{c.predicted_us:.2f} us" if c.predicted_us is not None else "-"
        print(f"{i}. {c.candidate}  (source {c.source}, predicted {lat})")
    # The order is the ranking model's; "predicted" comes from the latency companion, a separate
    # regression that is less exact between near-ties (GEMV configs 1-5% apart). Without this
    # note a user reads rank 2 "predicted faster" than rank 1 as a dispatcher bug.
    lats = [c.predicted_us for c in choices]
    if len(lats) > 1 and None not in lats and any(b < a for a, b in zip(lats, lats[1:])):
        print("note: the order is the ranking model's; 'predicted' is a separate latency estimate, "
              "less exact between near-ties, and orders some of these differently", file=sys.stderr)
    return 0


def cmd_export_vllm(args) -> int:
    """Write vLLM tuned-config files (w8a8 block fp8, or fused MoE) from the dispatcher's picks."""
    import warnings

    from gemm_costmodel.learning import vllm_export as V

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            V.check_op(args.op)
            moe = args.op == "moe"
            if moe and args.nk:
                raise ValueError("--op moe takes --moe E,N,K,TOPK, not --nk")
            if not moe and (args.moe or args.dtype):
                raise ValueError(f"--moe and --dtype are for --op moe, not {args.op}")
            if moe and not args.moe:
                raise ValueError("give at least one --moe E,N,K,TOPK (experts, intermediate size N as in vLLM's file "
                                 "name, hidden size K, experts per token), e.g. --moe 8,7168,4096,2")
            if not moe and not args.nk:
                raise ValueError("give at least one --nk N,K (the weight's N x K), e.g. --nk 5120,8960")
            if args.out and args.install:
                raise ValueError("give --out DIR or --install, not both")
            if args.vllm_package and not args.install:
                raise ValueError("--vllm-package is for --install")
            if not args.out and not args.install:
                raise ValueError("give --out DIR (a folder of your choice) or --install (where the installed vLLM "
                                 "reads the files)")
            specs = [V.parse_moe_spec(t) for t in args.moe] if moe else []
            pairs = [] if moe else [V.parse_nk(t) for t in args.nk]
            out = args.out or V.install_dir(args.op, args.vllm_package)
            planned = V.plan(V.planned_names(args.op, args.gpu, pairs, specs, args.dtype or "bf16"), out)
            if args.dry_run:
                for path, what in planned:
                    print(f"would write {path} ({what})")
                if args.install and moe and not os.environ.get("VLLM_TUNED_CONFIG_FOLDER"):
                    print("note: VLLM_TUNED_CONFIG_FOLDER is not set, so these go to vLLM's package folder; with it "
                          "set (here and where vLLM runs) they go there instead", file=sys.stderr)
                return 0
            V.check_plan(planned, force=args.force)
            if moe:
                written = V.export_moe(specs, out, gpu_name=args.gpu, models_dir=args.models,
                                       dtype=args.dtype or "bf16")
            else:
                written = V.export(pairs, out, gpu_name=args.gpu, models_dir=args.models, op=args.op)
        except (OSError, ValueError) as exc:
            return _fail(str(exc))
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    for path, table in written:
        print(V.summary_line(path, table))
    return 0


def cmd_describe_gpu(args) -> int:
    import torch

    from gemm_costmodel.kernels import hardware

    if not torch.cuda.is_available():
        print("describe-gpu: error: no CUDA device on this machine", file=sys.stderr)
        return 2
    try:
        spec = hardware.describe_current(probe=args.probe)
    except ValueError as exc:
        print(f"describe-gpu: error: {exc}", file=sys.stderr)
        return 2
    known = hardware.lookup(spec.name)
    entry = hardware.as_dict(spec)
    print(json.dumps(entry, indent=1))
    if known is not None:
        print(f"(the table already has {spec.name!r} as {known.name}: {hardware.as_dict(known)})", file=sys.stderr)
    if args.out:
        entries = []
        if os.path.isfile(args.out):
            with open(args.out, encoding="utf-8") as fh:
                entries = json.load(fh)
            if not isinstance(entries, list):
                print(f"describe-gpu: error: {args.out} holds no JSON list", file=sys.stderr)
                return 2
        entries = [e for e in entries if not (isinstance(e, dict) and e.get("name") == spec.name)] + [entry]
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(entries, fh, indent=1)
        print(f"wrote {args.out}; export COSTMODEL_GPU_SPECS={args.out}", file=sys.stderr)
    return 0


def _curve_file(args) -> str | None:
    """The adaptation-curve file a report of ``args.op`` shows: --curve, or with 'auto' the op's
    committed one (benchmarks/results/<op>/<card>/curve/curve.csv, relative to the working folder:
    the repository root), or none."""
    if args.curve == "none":
        return None
    if args.curve != "auto":
        return args.curve
    found = sorted(glob.glob(os.path.join("benchmarks", "results", args.op, "*", "curve", "curve.csv")))
    return found[0] if found else None


def _results_curve(args) -> int:
    """`costmodel results --curve CSV`: the curve section (plot and table) into a committed report,
    rewritten in place from the curve file alone (no retraining)."""
    from gemm_costmodel import registry
    from gemm_costmodel.learning import glance, report

    out_dir = args.report
    if out_dir is None:
        parts = os.path.normpath(args.curve).split(os.sep)
        op = parts[parts.index("results") + 1] if "results" in parts[:-1] else None
        if op not in registry.names():
            return _fail(f"{args.curve}: give --report DIR (no op's results folder in the path)")
        out_dir = os.path.dirname(glance.report_path(op, args.root))
    path = os.path.join(out_dir, "report.md")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        new = report.splice_curve(text, report.curve_section(args.curve, out_dir))
    except (OSError, ValueError) as exc:
        return _fail(str(exc))
    if new != text:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(new)
    print(f"{path}: curve section {'rewritten' if new != text else 'unchanged'} from {args.curve}; "
          f"plot {os.path.join(out_dir, report.CURVE_PNG)}")
    return 0


def cmd_results(args) -> int:
    """Print the results-at-a-glance table from the committed reports, or rewrite its block in a README."""
    from gemm_costmodel.learning import glance

    if args.curve:
        return _results_curve(args)
    if not args.readme:
        print(glance.table(args.root))
        return 0
    try:
        with open(args.readme, encoding="utf-8") as fh:
            text = fh.read()
        new = glance.rewrite(text, args.root)
        if args.peers:
            from gemm_costmodel.benchmarks import peers

            new = peers.rewrite_readme(new)
    except (OSError, ValueError) as exc:
        return _fail(f"{args.readme}: {exc}")
    if args.check:
        if new != text:
            return _fail(f"{args.readme}: the results block differs from the reports under {args.root}; "
                         f"rewrite it: costmodel results --readme {args.readme}")
        print(f"{args.readme}: the results block matches {args.root}")
        return 0
    if new != text:
        with open(args.readme, "w", encoding="utf-8") as fh:
            fh.write(new)
    print(f"{args.readme}: results block {'rewritten' if new != text else 'unchanged'} from {args.root}")
    return 0


def _op_arg(p) -> None:
    from gemm_costmodel import registry  # torch-free

    p.add_argument("--op", default=registry.DEFAULT_OP, choices=registry.names(),
                   help=f"operation (op registry; default {registry.DEFAULT_OP})")


def _model_args(p, report: bool = False, train: bool = False) -> None:
    from gemm_costmodel.learning.model import TrainConfig  # numpy only: no training dependency at parse time

    _op_arg(p)
    p.add_argument("--data", nargs="*", help="data files (default: all parquet under --root)")
    p.add_argument("--root", default="datasets")
    p.add_argument("--dtype", nargs="+", default=None, choices=DTYPE_CHOICES, help="default: all")
    p.add_argument("--gpu", nargs="+", default=None, help="only rows of these GPU names (default: all)")
    p.add_argument("--arch", default="sm90")
    # None: the op's registry train_defaults, else TrainConfig's (rank, 100 trees, depth 6, eta 0.2).
    p.add_argument("--formulation", default=None, choices=["log_latency", "normalized", "rank"])
    p.add_argument("--trees", type=int, default=None)
    p.add_argument("--depth", type=int, default=None)
    p.add_argument("--eval-weight", type=float, default=None,
                   help="weight of an evaluation shape (every candidate measured) vs a sampled one")
    p.add_argument("--eta", type=float, default=None)
    p.add_argument("--shortlist-tol", type=float, default=None,
                   help="runtime shortlist: candidates within this factor of a training shape's best per M "
                        "bucket (0: score every candidate; default: the op's, 1.03 for gemm, 0 for fp8_blockscale and moe)")
    p.add_argument("--vendor-margin", type=float, default=None,
                   help="pick a Triton config over the vendor library only when its ranking score is better by "
                        "more than this (default: the op's, else 0; every registered op ships 0)")
    p.add_argument("--parallel-trees", type=int, default=None,
                   help="trees per boosting round, averaged (xgboost num_parallel_tree; default: the op's, "
                        "else 1); the decision then evaluates that many times the trees")
    p.add_argument("--n-seeds", type=int, default=None,
                   help="whole models averaged, trained with seeds --seed, --seed + 1, ... and merged into one "
                        "booster (default: the op's, else 1); training and the decision cost that many times")
    p.add_argument("--rank-step", type=float, default=None,
                   help="grade step of the rank labels: candidates within this factor of each other share a "
                        "grade (default: the op's, else 1.03)")
    p.add_argument("--decode-weight", type=float, default=None,
                   help="extra weight of a decode shape's ranking query (M <= --decode-max-m), on top of "
                        "--eval-weight (default: the op's, else 1)")
    p.add_argument("--decode-max-m", type=int, default=None,
                   help="largest M that --decode-weight applies to (default: the op's, else 4)")
    p.add_argument("--shortlist-edges", type=_int_tuple, default=None, metavar="M1,M2,...",
                   help="upper M edges of the shortlist's buckets, increasing (default: the op's registry "
                        "value: gemm 1,2,4,...,4096, else 16,64,256,1024)")
    p.add_argument("--split-m", type=int, default=None,
                   help="queries with M <= this get trees of their own, joined with the rest under a root "
                        "split on M (0: one model for every M; default: the op's registry value: gemm 2, "
                        "moe 4, fp8_blockscale 1)")
    p.add_argument("--split-high-rows", choices=("high", "all"), default=None,
                   help="with --split-m: the queries the M > split-m trees are fitted on, their own ('high') "
                        "or every query ('all'); the M <= split-m trees' queries are --split-low-rows' (default: "
                        "the op's registry value: fp8_blockscale all, else high)")
    p.add_argument("--split-low-rows", choices=("low", "all"), default=None,
                   help="with --split-m: the queries the M <= split-m trees are fitted on, their own ('low') "
                        "or every query ('all', their own weighted --split-low-weight times) (default: the "
                        "op's registry value, else low)")
    p.add_argument("--split-low-weight", type=float, default=None,
                   help="with --split-low-rows all: the weight factor of the M <= split-m queries (default: "
                        "the op's registry value, else 1)")
    p.add_argument("--weight-gpu", default=None, metavar="GPU_NAME",
                   help="the card (a gpu_name of the rows, exactly) whose ranking queries --gpu-weight weighs "
                        "(default: the op's registry value, else none)")
    p.add_argument("--gpu-weight", type=float, default=None,
                   help="weight factor of --weight-gpu's queries, on top of --eval-weight and --decode-weight "
                        "(default: the op's registry value, else 1)")
    p.add_argument("--jobs", type=int, default=2, help="xgboost threads")
    p.add_argument("--seed", type=int, default=0)
    if report:
        p.add_argument("--report", default="models/report", help="report folder")
        # evaluate.SCHEMES (not imported here: pandas at parse time; tests/test_card_scheme.py checks).
        p.add_argument("--schemes", nargs="+", default=["family", "nk"], choices=["family", "nk", "card", "card_adapt"],
                       help="held-out schemes: leave one family out, one (N, K) group out, one card out "
                            "(by family; none of the card's rows train), or one card out but its "
                            "adaptation rows (`costmodel adapt`'s rounds) train (default: family nk)")
        p.add_argument("--train-gpu", nargs="+", default=None, metavar="GPU_NAME",
                       help="learn only from these GPUs' rows (with run, the final model too) while the "
                            "report scores every GPU's held-out shapes: how a model trained on one card "
                            "ranks another's (default: every GPU in the data)")
        p.add_argument("--curve", default="auto", metavar="CSV",
                       help="the adaptation-curve file whose plot and table the report shows ('auto': the op's "
                            "committed benchmarks/results/OP/*/curve/curve.csv, relative to the working folder; "
                            "'none': no curve section)")
        p.add_argument("--sampled-heldout", action="store_true",
                       help="hold out the problems measured on a sample of their candidates too (pick/sample "
                            "sweeps; at least 4 ok candidates), each scored against the best candidate measured "
                            "on it: for an op without fully measured evaluation shapes yet; not the full-space "
                            "oracle's figures (the report and the manifest's metrics say so)")
        p.add_argument("--compare", action="store_true", help="also compare formulations (slower)")
        p.add_argument("--select", action="store_true", help="with --compare: evaluate the best one")
    if report or train:
        p.add_argument("--no-latency-model", dest="latency_model", action="store_false",
                       help="skip the log-latency companion of a rank/normalized model (its export, and its "
                            "held-out predictions: the report then plots no predicted-vs-measured latencies)")
    if train:
        p.add_argument("--out", default="models", help="folder for the ONNX model and manifest")
        p.add_argument("--booster", default="", help="also save the xgboost booster here (JSON)")
        p.add_argument("--no-export", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="costmodel", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("bench", help="measure (shape, candidate) latencies on the GPU")
    _op_arg(b)
    src = b.add_mutually_exclusive_group()
    src.add_argument("--suite", default="foundation",
                     help="a shape suite of the op (gemm: foundation, train; fp8_blockscale: train, eval, gate; "
                          "moe: train, train_skewed, eval, vllm, gate)")
    src.add_argument("--shapes", help="CSV with one column per problem field of the op: M,N,K[,dtype] "
                     "(moe: M,N,K,E,top_k,stage[,routing][,dtype]; routing default balanced); unknown columns "
                     "are refused")
    b.add_argument("--dtype", nargs="+", default=None, choices=DTYPE_CHOICES,
                   help="default: the op's first dtype (bf16; fp8 for fp8_blockscale)")
    b.add_argument("--mode", default="all", help="'all' (evaluation shapes), 'sample:K' (K random Triton configs + cuBLAS), 'variant:NAME[,NAME]' (one variant's configs + cuBLAS) or 'pick:CSV' (the configs a CSV with columns key, candidate lists per problem key + cuBLAS)")
    b.add_argument("--shard", default="0/1", help="i/n: take shapes with hash %% n == i")
    b.add_argument("--devices", type=int, default=0, help="spawn one process per GPU")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--arch", default="sm90")
    b.add_argument("--out", default=RAW_DIR, help="folder of the shard files (default datasets/raw, which "
                   "`costmodel dataset build` reads)")
    b.add_argument("--name", default="sweep", help="file name prefix of the shard files")
    b.add_argument("--timer", default="graph", choices=["graph", "do_bench"])
    b.add_argument("--only", help="CSV (M,N,K[,dtype][,stage]): keep only these shapes of the suite, e.g. to "
                   "re-measure (a stage column: only those stages of a multi-stage op)")
    b.add_argument("--limit", type=int, default=0, help="first N shapes only")
    b.add_argument("--workers", type=int, default=0, help="precompile worker processes")
    b.add_argument("--no-precompile", dest="precompile", action="store_false")
    b.add_argument("--time-budget", type=float, default=0,
                   help="stop cleanly between shapes after this many seconds (resume later)")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(func=cmd_bench)

    s = sub.add_parser("summarize", help="summarize result files (oracle vs cuBLAS, HBM floor)")
    s.add_argument("results", nargs="+", help="JSONL result files or globs")
    s.add_argument("--copy-gbps", type=float, default=None, help="measured copy bandwidth for the HBM floor")
    s.set_defaults(func=cmd_summarize)

    d = sub.add_parser("dataset", help="build, validate or describe the dataset")
    d.add_argument("action", choices=["build", "validate", "card"])
    d.add_argument("files", nargs="*", help="data files (default: all parquet under --root)")
    d.add_argument("--raw", nargs="+", default=None,
                   help="harness shards to convert (build; default: datasets/raw/*-shard*.jsonl.gz and .jsonl, "
                        "where `costmodel bench` writes)")
    d.add_argument("--root", default="datasets")
    d.add_argument("--remeasure", nargs="*", default=["datasets/raw/remeasure*.jsonl.gz"],
                   help="noise-floor re-measurements (card); '' to skip")
    d.set_defaults(func=cmd_dataset)

    im = sub.add_parser("import", help="import timings measured elsewhere (CSV, vLLM tuned tables)")
    im.add_argument("format", choices=["csv", "vllm"])
    im.add_argument("files", nargs="+")
    im.add_argument("--out", required=True, help="parquet file to write")
    im.add_argument("--hidden", type=int, default=0, help="hidden size K (vllm: not in the files)")
    im.add_argument("--top-k", type=int, default=1, help="experts per token (vllm)")
    im.set_defaults(func=cmd_import)

    c = sub.add_parser("configs", help="count the candidate space")
    _op_arg(c)
    c.add_argument("--dtype", nargs="+", default=None, help="default: every dtype the op takes")
    c.add_argument("--arch", default="sm90")
    c.set_defaults(func=cmd_configs)

    t = sub.add_parser("train", help="train the cost model on benchmark data and export it to ONNX")
    _model_args(t, train=True)
    # train never writes into the shipped models/ by default (a few rows once replaced a model of
    # half a million): --out is required to export, --force to write into models/ itself.
    t.set_defaults(func=cmd_train, out=None)
    t.add_argument("--force", action="store_true",
                   help="allow --out to be the shipped models folder (replaces the shipped model of the op)")
    t.add_argument("--min-problems", type=int, default=None,
                   help="refuse to train when a dtype has fewer problems with two or more trainable candidates "
                        "(default: learning.pipeline.MIN_PROBLEMS_PER_DTYPE, 20)")

    e = sub.add_parser("evaluate", help="held-out evaluation against the baselines; writes a report")
    _model_args(e, report=True)
    e.set_defaults(func=cmd_evaluate)

    x = sub.add_parser("export", help="export a saved booster (costmodel train --booster) to ONNX")
    _op_arg(x)
    x.add_argument("booster")
    x.add_argument("--out", default="models")
    x.add_argument("--arch", default="sm90")
    x.set_defaults(func=cmd_export)

    q = sub.add_parser("select", help="what the dispatcher picks for one problem (y = x @ w.T, x MxK, w NxK)",
                       epilog="examples: costmodel select 16 4096 4096 --top 3; costmodel select --op moe 16 1536 "
                              "2048 --e 128 --top-k 8 --stage gate_up; costmodel select --op fp8_blockscale 1 7168 "
                              "2048 --dtype fp8")
    _op_arg(q)
    q.add_argument("m", type=int)
    q.add_argument("n", type=int)
    q.add_argument("k", type=int)
    q.add_argument("--dtype", default=None, choices=DTYPE_CHOICES,
                   help="default: the op's first dtype (bf16; fp8 for fp8_blockscale)")
    q.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="GPU name (default: H100 SXM)")
    q.add_argument("--models", default=None, help="model folder (default: the shipped models)")
    q.add_argument("--top", type=int, default=1, help="show the model's top k")
    _problem_field_args(q)
    q.set_defaults(func=cmd_select)

    v = sub.add_parser("export-vllm", help="write vLLM tuned-config files from the dispatcher's picks: w8a8 block "
                                           "fp8 (one per --nk N,K) or fused MoE (--op moe, one per --moe E,N,K,TOPK)")
    v.add_argument("--op", default="fp8_blockscale", help="the op (export-vllm supports fp8_blockscale, moe)")
    v.add_argument("--nk", action="append", default=[], metavar="N,K", help="a weight shape N,K (repeatable)")
    v.add_argument("--moe", action="append", default=[], metavar="E,N,K,TOPK",
                   help="--op moe: one MoE layer: experts per rank, intermediate size per shard (vLLM's N), hidden "
                        "size, experts per token (repeatable; vLLM names its file by E and N only)")
    v.add_argument("--dtype", default=None, choices=DTYPE_CHOICES,
                   help="--op moe: activation dtype (default bf16; fp8 writes vLLM's dtype=fp8_w8a8 files, "
                        "fp8bs its dtype=fp8_w8a8,block_shape=[128,128] files)")
    v.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="GPU name, as CUDA names it (default: H100 SXM)")
    v.add_argument("--models", default=None, help="model folder (default: the shipped models)")
    v.add_argument("--out", default=None, help="folder for the vLLM files")
    v.add_argument("--install", action="store_true",
                   help="write where the installed vLLM reads them: MoE files to $VLLM_TUNED_CONFIG_FOLDER if set, "
                        "else the package's fused_moe/configs/; block-fp8 files to the package's "
                        "quantization/utils/configs/ (the only folder vLLM reads them from)")
    v.add_argument("--vllm-package", default=None, metavar="DIR",
                   help="--install: the vllm package folder (default: the one this Python imports)")
    v.add_argument("--dry-run", action="store_true", help="list every file it would write and where; write nothing")
    v.add_argument("--force", action="store_true",
                   help="replace files no export wrote (e.g. vLLM's own tuned files); default: refuse")
    v.set_defaults(func=cmd_export_vllm)

    from gemm_costmodel import registry  # torch-free

    a = sub.add_parser("adapt", help="learn this machine's GPU in minutes: model-guided measurements + retrain "
                       "(docs/adapting.md)")
    a.add_argument("--op", required=True, choices=registry.names())
    a.add_argument("--dtype", nargs="+", default=None, help="default: every dtype of the op")
    a.add_argument("--minutes", type=float, default=10.0, help="device-minutes to spend measuring (default 10)")
    a.add_argument("--out", required=True, help="folder for the rows, the model and the state (resumable)")
    a.add_argument("--gpu", default=None, help="GPU name to record (default: the current device's name)")
    a.add_argument("--problems", type=int, default=400, help="training problems per round (default 400)")
    a.add_argument("--top", type=int, default=8, help="the model's best configs measured per problem (default 8)")
    a.add_argument("--models", default=None, help="the starting model folder (default: the shipped models)")
    a.add_argument("--root", default="datasets", help="the shipped dataset folder")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--jobs", type=int, default=2, help="xgboost threads")
    a.add_argument("--plan", action="store_true",
                   help="only write the next round's picks CSVs into --out (skipping problems its picks-r*.csv "
                        "list) and print the `costmodel bench` lines that measure them; no GPU needed (--gpu)")
    a.add_argument("--heldout", action="store_true",
                   help="at the end, leave-one-family-out figures on this card's evaluation problems, if the "
                        "data holds their oracle")
    a.set_defaults(func=cmd_adapt)


    g = sub.add_parser("results", help="the results-at-a-glance table from the reports (every op's held-out "
                                       "families); --readme rewrites its block in a README")
    g.add_argument("--root", default="models/report", help="reports' folder (gemm's report.md, <op>/report.md)")
    g.add_argument("--readme", default=None, help="rewrite the block between the results markers of this file")
    g.add_argument("--check", action="store_true", help="with --readme: only check; exit 2 if it differs")
    g.add_argument("--peers", action="store_true",
                   help="with --readme: also rewrite the peers block from benchmarks/results/peers/ (the runs "
                        "benchmarks/peers.py README_RUNS names)")
    g.add_argument("--curve", default=None, metavar="CSV",
                   help="instead: draw an adaptation-curve file (benchmarks/results/<op>/<card>/curve/curve.csv) "
                        "into a report (plot and table, the section `costmodel run` writes), from the file alone")
    g.add_argument("--report", default=None, metavar="DIR",
                   help="with --curve: the report's folder (default: the op's under --root, from the curve's path)")
    g.set_defaults(func=cmd_results)

    h = sub.add_parser("describe-gpu", help="describe this machine's GPU by its numbers (SMs, shared memory, L2, "
                                            "HBM bandwidth, tensor-core rate) for a card the hardware table lacks",
                       description="Prints the current GPU as a hardware-table entry; --probe measures the copy "
                                   "bandwidth and a bf16 matrix product (about a second) instead of trusting the "
                                   "driver's clocks; --out writes (or updates) a COSTMODEL_GPU_SPECS file.")
    h.add_argument("--probe", action="store_true", help="measure bandwidth and tensor-core rate (short probe)")
    h.add_argument("--out", default=None, help="JSON file to write/update (a list of entries; point "
                                               "COSTMODEL_GPU_SPECS at it)")
    h.set_defaults(func=cmd_describe_gpu)

    r = sub.add_parser("run", help="main job: evaluate (report) + train + export on the shipped data, into a "
                                   f"work folder (default ./{RUN_OUT}/); about 8 minutes and 5 GiB on 2 cores",
                       description="The main job on the shipped data: held-out evaluation against every baseline "
                                   "(report), then the final model trained on every row and exported to ONNX. "
                                   f"Writes into --out (default ./{RUN_OUT}/, git-ignored; the report into "
                                   "OUT/report/, or OUT/report/OP/ for ops other than gemm, the layout of the shipped "
                                   "models/ folder, which stays the committed reference) and lists what it wrote. "
                                   "--out models overwrites the shipped models.")
    _model_args(r, report=True, train=True)
    r.set_defaults(func=cmd_run, out=RUN_OUT, report=None)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
