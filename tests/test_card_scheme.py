"""Leave-one-card-out evaluation (issue 58): hand-computed folds on two cards, adaptation rows told
by their suite name, the cross-validation and the report section end to end on a small frame."""
from __future__ import annotations

import pandas as pd
import pytest

from gemm_costmodel import adapt as A
from gemm_costmodel import cli
from gemm_costmodel.learning import evaluate as E
from gemm_costmodel.learning import report as R
from gemm_costmodel.learning.model import TrainConfig

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def row(gpu, m, cand, p50, family, eval_shape=True, suite="sweep", origins=None):
    r = {"gpu_name": gpu, "op": "gemm", "dtype": "fp8", "m": m, "n": 1024, "k": 1024, "e": 1, "top_k": 1,
         "candidate": cand, "variant": "vendor" if cand == "cublas" else "tiled", "p50_us": p50, "status": "ok",
         "stable": True, "eval_shape": eval_shape, "family": family, "suite": suite,
         "origins": origins or f"{family}/model/layer/tp1"}
    tile = {"block_m": 64, "block_n": 64, "block_k": 64, "group_m": 8, "split_k": 1, "num_warps": 4, "num_stages": 3}
    r.update({q: (0 if cand == "cublas" else v) for q, v in tile.items()})
    return r


def shape(gpu, m, family, **kw):
    return [row(gpu, m, "c1", 1.0, family, **kw), row(gpu, m, "cublas", 2.0, family, **kw)]


def two_cards():
    """Rows by M (each a shape of two candidates):
      H100: 1 eval a, 2 eval b, 3 train a, 4 train c (origins c and b)
      H200: 11 eval a, 12 eval b, 13 train c from adaptation round 0, 14 train b from round 1,
            15 train c from a random sweep (not adaptation)."""
    return pd.DataFrame(
        shape(H100, 1, "a") + shape(H100, 2, "b") + shape(H100, 3, "a", eval_shape=False)
        + shape(H100, 4, "c", eval_shape=False, origins="c/m/l/tp1;b/m/l/tp2")
        + shape(H200, 11, "a") + shape(H200, 12, "b")
        + shape(H200, 13, "c", eval_shape=False, suite="gemm-adapt0-train-fp8-nvidia-h200")
        + shape(H200, 14, "b", eval_shape=False, suite="moe-adapt1-h200")
        + shape(H200, 15, "c", eval_shape=False, suite="gemm-train-h200"))


def ms(frame):
    return sorted(set(frame["m"]))


def test_adaptation_rows_by_suite_name():
    df = two_cards()
    assert ms(df[E.adaptation_rows(df)]) == [13, 14]
    # What `costmodel adapt` names its rounds is what the evaluation recognises.
    name = A.round_name("moe", 3, "train_skewed", "fp8", A.gpu_slug(H200))
    assert E.adaptation_rows(pd.DataFrame({"suite": [name, "moe-train-h200", "readaptation", "adapt", "adapt2"]})).tolist() == [
        True, False, False, False, True]
    assert not E.adaptation_rows(df.drop(columns="suite")).any()


def test_card_folds_by_hand():
    folds = {f.name: f for f in E.card_folds(two_cards())}
    assert sorted(folds) == [f"{H100}/a", f"{H100}/b", f"{H200}/a", f"{H200}/b"]
    # H200 out, family a held out: the H100's rows of other families only (2 eval b, 4 train c),
    # none of the H200's; scored: the H200's eval shape of a.
    assert ms(folds[f"{H200}/a"].test) == [11]
    assert ms(folds[f"{H200}/a"].train) == [2, 4]
    assert set(folds[f"{H200}/a"].train["gpu_name"]) == {H100}
    # Family b held out: 4 goes too (one of its origins is b).
    assert ms(folds[f"{H200}/b"].test) == [12]
    assert ms(folds[f"{H200}/b"].train) == [1, 3]
    # H100 out: the H200's rows outside the family, its evaluation, random and adaptation rows alike.
    assert ms(folds[f"{H100}/a"].test) == [1]
    assert ms(folds[f"{H100}/a"].train) == [12, 13, 14, 15]
    assert ms(folds[f"{H100}/b"].train) == [11, 13, 15]
    # The test side is the evaluation rows of the card and family, with shape ids.
    assert "sid" in folds[f"{H200}/a"].test.columns


def test_card_adapt_folds_by_hand():
    folds = {f.name: f for f in E.card_folds(two_cards(), adapt=True)}
    # The H100 has no adaptation rows: no fold (its figures would be the plain scheme's).
    assert sorted(folds) == [f"{H200}/a", f"{H200}/b"]
    # The H200's adaptation rows outside the family join the H100's rows; never its evaluation
    # rows or its random sweep (15).
    assert ms(folds[f"{H200}/a"].train) == [2, 4, 13, 14]
    assert ms(folds[f"{H200}/b"].train) == [1, 3, 13]  # 14 is a family-b problem
    assert ms(folds[f"{H200}/b"].test) == [12]


def test_folds_of_names_an_unknown_scheme():
    with pytest.raises(ValueError, match="unknown scheme 'cards'"):
        E.folds_of(two_cards(), "cards")


def test_card_adapt_without_adaptation_rows_says_so():
    df = two_cards()
    df = df[~E.adaptation_rows(df)]
    with pytest.raises(ValueError, match="no card with evaluation shapes has adaptation rows"):
        E.cross_validate(df, TrainConfig(n_estimators=2, max_depth=2, n_jobs=1), scheme="card_adapt")


def test_cli_schemes_are_the_evaluations():
    args = cli.build_parser().parse_args(["evaluate", "--schemes", *E.SCHEMES])
    assert tuple(args.schemes) == E.SCHEMES
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["evaluate", "--schemes", "cards"])


@pytest.fixture(scope="module")
def fp8_two_cards():
    """The gemm fp8 subset of test_evaluate measured on 'two cards': its rows, and the same rows
    again as an H100's, a third of whose training rows came from an adaptation round."""
    from gemm_costmodel.learning.pipeline import load_training_frame

    df = load_training_frame(["datasets/gemm/fp8/eval-fp8-shard01of40.parquet",
                              "datasets/gemm/fp8/train-fp8-shard00of16.parquet"], op="gemm")
    gpu = str(df["gpu_name"].iloc[0])
    other = H100 if gpu != H100 else H200
    twin = df.assign(gpu_name=other)
    sid = twin.groupby(["m", "n", "k"]).ngroup()
    adapted = ~twin["eval_shape"].astype(bool) & (sid % 3 == 0)
    twin.loc[adapted, "suite"] = "gemm-adapt0-train-fp8-x"
    return pd.concat([df, twin], ignore_index=True), gpu, other


def test_cross_validate_card_schemes_and_report(fp8_two_cards, tmp_path):
    df, gpu, other = fp8_two_cards
    cfg = TrainConfig(n_estimators=5, max_depth=3, n_jobs=1)
    res, rows = E.cross_validate(df, cfg, scheme="card", baselines=False)
    ada, _ = E.cross_validate(df, cfg, scheme="card_adapt", baselines=False)
    n_eval = df[df["eval_shape"].astype(bool)].drop_duplicates(["gpu_name", "m", "n", "k"]).shape[0]
    # Every evaluation shape of both cards is scored once under 'card'; only the card with
    # adaptation rows under 'card_adapt'.
    assert len(res) == n_eval and set(res["method"]) == {"model"}
    assert set(res["gpu_name"]) == {gpu, other}
    assert set(ada["gpu_name"]) == {other}
    assert (res["fold"].str.split("/").str[0] == res["gpu_name"]).all()
    text = R.card_section({"card": res, "card_adapt": ada}, adapted={other: int(E.adaptation_rows(df).sum())})
    assert text.startswith("## Leave-one-card-out")
    assert f"### {other} ({int(E.adaptation_rows(df).sum()):,} adaptation rows)" in text
    assert "| card_adapt | the card's adaptation rows only | fp8 |" in text
    path = R.write_report(str(tmp_path), None, None, rows, header="", extra_sections=[text],
                          cards={"card": res, "card_adapt": ada})
    assert (tmp_path / "results_card.csv").is_file() and (tmp_path / "results_card_adapt.csv").is_file()
    assert "## Leave-one-card-out" in open(path, encoding="utf-8").read()


# -- the adaptation curve in the report ----------------------------------------------------------

CURVE = "benchmarks/results/moe/h200/curve/curve.csv"


def test_curve_arms_start_at_none():
    curve = R.read_curve(CURVE)
    arms = R.curve_arms(curve, H200, "bf16")
    assert list(arms) == ["adapt", "random"]  # 'all_h200_rows' is the reference, not an arm
    assert arms["adapt"]["point"].tolist() == ["none", "adapt", "adapt", "adapt"]
    assert arms["adapt"]["device_minutes"].tolist() == [0.0, 1.0, 2.0, 3.22]
    assert arms["random"]["geomean_slowdown"].tolist() == [1.0421, 1.0312, 1.0365, 1.0411]


def test_read_curve_names_a_missing_column(tmp_path):
    p = tmp_path / "c.csv"
    pd.read_csv(CURVE).drop(columns="match_2pct").to_csv(p, index=False)
    with pytest.raises(ValueError, match="not a curve file .no column match_2pct"):
        R.read_curve(str(p))


def test_curve_section_splices_where_run_puts_it(tmp_path):
    sec = R.curve_section(CURVE, str(tmp_path))
    assert (tmp_path / R.CURVE_PNG).stat().st_size > 10_000
    assert "| adapt | 2 | 1,280 | 1.0189 | 76.6% | 1.0339 | 72.7% |" in sec
    # Where write_report puts an extra section: before the plots; splicing puts it there too,
    # and splicing again changes nothing.
    path = R.write_report(str(tmp_path / "r"), None, None, None, header="", extra_sections=["## Other\n", sec],
                          cards={"card": pd.read_csv("models/report/moe/results_family.csv").head(40)})
    full = open(path, encoding="utf-8").read()
    bare = full.replace(sec + "\n", "")
    assert "curve:begin" not in bare
    assert R.splice_curve(bare, sec) == full
    assert R.splice_curve(full, sec) == full


def test_committed_moe_report_shows_the_committed_curve(tmp_path):
    """models/report/moe/report.md holds what `costmodel results --curve` writes from the curve file."""
    text = open("models/report/moe/report.md", encoding="utf-8").read()
    assert R.splice_curve(text, R.curve_section(CURVE, str(tmp_path))) == text, (
        f"stale curve section: run `costmodel results --curve {CURVE}`")


def test_cli_results_curve(tmp_path, capsys):
    import shutil

    shutil.copy("models/report/moe/report.md", tmp_path / "report.md")
    assert cli.main(["results", "--curve", CURVE, "--report", str(tmp_path)]) == 0
    assert "unchanged" in capsys.readouterr().out  # the committed report has it already
    assert (tmp_path / R.CURVE_PNG).is_file()
    assert cli.main(["results", "--curve", str(tmp_path / "report.md")]) == 2  # no op folder in the path


def test_cli_evaluate_card_schemes(tmp_path, capsys):
    """`costmodel evaluate --schemes family card card_adapt` on the fp8 subset and its copy as an
    H100's (a third of whose training rows are adaptation rows): the section, the CSVs, no curve."""
    ev, tr = "datasets/gemm/fp8/eval-fp8-shard01of40.parquet", "datasets/gemm/fp8/train-fp8-shard00of16.parquet"
    copies = []
    for src in (ev, tr):
        df = pd.read_parquet(src).assign(gpu_name=H100)
        if src == tr:
            df.loc[df.groupby(["m", "n", "k"]).ngroup() % 3 == 0, "suite"] = "gemm-adapt0-train-fp8-h100"
        copies.append(str(tmp_path / f"h100-{len(copies)}.parquet"))
        df.to_parquet(copies[-1], index=False)
    report = tmp_path / "r"
    rc = cli.main(["evaluate", "--data", ev, tr, *copies, "--trees", "5", "--depth", "3", "--jobs", "1",
                   "--schemes", "family", "card", "card_adapt", "--no-latency-model", "--curve", "none",
                   "--report", str(report)])
    assert rc == 0, capsys.readouterr().err
    md = (report / "report.md").read_text()
    assert "## Leave-one-card-out" in md and "## Adaptation curve" not in md
    assert f"### {H100} (" in md and "| card_adapt | the card's adaptation rows only | fp8 |" in md
    assert "| family | every row of every card but the family's | fp8 |" in md
    assert {"results_family.csv", "results_card.csv", "results_card_adapt.csv"} <= {p.name for p in report.iterdir()}
    assert "pred_vs_measured.png" not in md  # --no-latency-model: no companion, no plot
