#!/usr/bin/env bash
# The CPU cost model on a many-core machine, without the 2-core box's time-slicing: run on the
# device machine's CPU with its GPU hidden (docs/measuring.md "On 16 cores"). Writes to $OUT:
# machine.txt, cal_small.txt, bench.txt, scaling.json, cal_moe.txt, moe.txt (the README's
# MoE run, twice). Each step's output lands as it finishes, so a timeout still returns the rest.
set -u
O=${OUT:-/tmp/cpu16}; mkdir -p "$O"
export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 PTD_HOME=/tmp/ptdhome PYTHONPATH=$PWD/src
ptd() { python -m ptd "$@"; }
{ nproc; lscpu | grep -E 'Model name|Thread|Socket|NUMA'; python -c 'import torch; print(torch.__version__)'; } > "$O/machine.txt" 2>&1
ptd calibrate --model small > "$O/cal_small.txt" 2>&1
ptd bench scaling --hardware calibrated --no-plots --out /tmp/bench --force > "$O/bench.txt" 2>&1
cp /tmp/bench/scaling.json "$O/" 2>/dev/null
ptd calibrate --model tiny-moe --out /tmp/moe.toml > "$O/cal_moe.txt" 2>&1
for i in 1 2; do
  ptd train --model tiny-moe --nproc 4 --ep 2 --steps 30 --global-batch 16 --seq-len 128 \
      --hardware /tmp/moe.toml --out /tmp/moe$i --force >> "$O/moe.txt" 2>&1
done
