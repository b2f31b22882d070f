#!/usr/bin/env bash
# Runs the GPU check that tools/gpu/pack.sh packed beside this script: unpacks check.tar.xz
# into a temporary folder and runs its tools/gpu/run_checks.sh there (RESULTS_DIR, default the
# temporary folder, receives the logs and test XML).
#
#   [LGPT_GPU_SECTIONS="tests kernels serving"] [LGPT_GPU_CAPACITY=1] bash run.sh [RESULTS_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
xz -dc "$here/check.tar.xz" | tar -C "$work" -xf -
results="${1:-$work/results}"
mkdir -p "$results"
results="$(cd "$results" && pwd)"
cd "$work/check"
bash tools/gpu/run_checks.sh "$results"
