#!/usr/bin/env bash
# The GPU benchmark, for when a CUDA machine is at hand: `base` (the paper's 65M model) on one
# GPU in bf16, torch.compile off and on, against the torch.nn.Transformer reference; then a
# 90-second `tf train` of base and decoding with it (greedy, beam 5, cached vs uncached).
# Prints tokens/s, TFLOP/s and MFU (model FLOPs utilisation: TFLOP/s over the GPU's dense bf16
# peak, from benchmarks/train_bench.py's table of data-sheet figures); about
# 5 minutes unattended. Needs a CUDA build of torch: `make install TORCH=torch`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT_DIR:-bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

echo "== training step of base, bf16, compile off/on (20 batches of up to 25k tokens)"
$PY -m benchmarks.train_bench --config base --device cuda --precision bf16 --compile \
    --batches 20 --repeats 3

echo "== tf train base for 90 s, then decoding"
$PY -m cli.main train base --out "$OUT/base-gpu" --force --set train.max_time=90 \
    --set train.eval_every=0 --set train.save_every=0 --set train.precision=bf16
$PY -m benchmarks.decode_bench --run "$OUT/base-gpu" --device cuda --sentences 1000 \
    --uncached-sentences 200
