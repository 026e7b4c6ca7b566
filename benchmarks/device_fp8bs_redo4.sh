#!/usr/bin/env bash
# A third complete run of the fp8_blockscale evaluation shapes whose two runs disagree (issue 16;
# benchmarks/results/fp8_blockscale/redo4_eval_shapes.csv, written by
# benchmarks/explore/disputed_shapes.py: a candidate within 10% of the shape's best reads more than
# 5% apart between two runs; 17 shapes). With two runs the loader's median is their mean, so one
# run's glitch still moves a key by half of it; with three the median rejects it. Every candidate
# in one run per shape (fp8bs-redo4-eval-h100), by device_watch.sh's fp8bs_eval_rerun (the
# one-driver scheme of its sweep_driver); only on an H100.
#
#   benchmarks/device_fp8bs_redo4.sh OUT WAIT
# WAIT plus about 40 s of packing must fit in the call's time limit.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
fp8bs_eval_rerun redo4 "$1" "$2"
exit 0
