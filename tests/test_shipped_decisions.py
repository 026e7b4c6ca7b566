"""The shipped model's decisions on every evaluation shape, pinned.

tests/data/shipped_decisions.csv was written by the dispatcher before the op
registry moved the space, feasibility and features behind one seam; a refactor
that changes no behaviour reproduces every row (the pick, its source and the
model's top 3). Retraining the shipped model changes them: write the file again
then (the script is in the file's test below, `write_decisions`).
"""
import csv
import os

import pytest

from gemm_costmodel.serving.runtime import Dispatcher

PATH = os.path.join(os.path.dirname(__file__), "data", "shipped_decisions.csv")


def write_decisions(path=PATH, root="datasets"):  # pragma: no cover - run by hand after retraining
    from gemm_costmodel.data import dataset as D

    df = D.load_dataset(root=root)
    # The dense op's shapes only: the dataset also holds the other ops' (datasets/<op>/).
    ev = df[df["eval_shape"].astype(bool) & (df["op"].astype(str) == "gemm")].drop_duplicates(
        ["gpu_name", "dtype", "m", "n", "k"])
    disp = {}
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["gpu_name", "dtype", "m", "n", "k", "choice", "source", "top3"])
        for r in ev.sort_values(["gpu_name", "dtype", "m", "n", "k"]).itertuples():
            d = disp.setdefault(str(r.gpu_name), Dispatcher(gpu_name=str(r.gpu_name)))
            c = d.select(int(r.m), int(r.n), int(r.k), str(r.dtype))
            top = d.rank(int(r.m), int(r.n), int(r.k), str(r.dtype), count=3)
            w.writerow([r.gpu_name, r.dtype, r.m, r.n, r.k, c.candidate, c.source, "|".join(t.candidate for t in top)])


def _rows():
    with open(PATH, newline="") as fh:
        return list(csv.DictReader(fh))


def test_every_evaluation_shape_is_pinned():
    rows = _rows()
    assert len(rows) == 737
    assert {r["gpu_name"] for r in rows} == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}


@pytest.mark.parametrize("gpu", ["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
def test_shipped_model_decides_as_pinned(gpu):
    d = Dispatcher(gpu_name=gpu)
    diffs = []
    for r in (r for r in _rows() if r["gpu_name"] == gpu):
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        c = d.select(m, n, k, r["dtype"])
        top = "|".join(t.candidate for t in d.rank(m, n, k, r["dtype"], count=3))
        if (c.candidate, c.source, top) != (r["choice"], r["source"], r["top3"]):
            diffs.append(f"{r['dtype']}:{m}x{n}x{k}: {c.candidate}/{c.source}/{top} != {r['choice']}/{r['source']}/{r['top3']}")
    assert not diffs, f"{len(diffs)} decisions changed, e.g. {diffs[:3]}"
