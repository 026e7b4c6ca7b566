#!/usr/bin/env bash
# A second complete run of every fp8_blockscale evaluation shape with M > 1 that had only one
# (issue 16; benchmarks/results/fp8_blockscale/redo3_eval_shapes.csv: 55 shapes). The other 65
# M > 1 shapes have two (fp8bs-redo-eval-) and the 37 M = 1 ones two or three, so afterwards every
# evaluation shape's oracle is the loader's median of at least two runs, and one run's glitch no
# longer decides a shape. Every candidate in one run per shape (fp8bs-redo3-eval-h100).
# device_watch.sh's fp8bs_eval_rerun (the one-driver scheme of its sweep_driver); only on an H100.
#
#   benchmarks/device_fp8bs_redo3.sh OUT WAIT
# WAIT plus about 40 s of packing must fit in the call's time limit.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
fp8bs_eval_rerun redo3 "$1" "$2"
exit 0
