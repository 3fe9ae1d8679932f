#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-build.sh (carry gpu-pack): one launch of the
# one-kernel decoding step at one batch (default 64) under Nsight Compute's full set, so that
# its stall reasons say what the stages' K loops wait on (the stage trace at 64 puts 2.6 to
# 3.5 us a stage in them, where their tensor-core work and shared-memory reads should take
# well under 1 us; docs/BENCHMARKS.md). The eager path's launch is profiled (a plain kernel
# launch; the WHILE and replay paths launch the same kernel from graphs), after the warm-up
# ones. Writes $OUT/decoder-ncu-b<batch>.txt (the details page: speed of light, occupancy,
# warp states, instruction mix) and, where this ncu prints it, the SASS with its sampled stall
# reasons ($OUT/decoder-ncu-b<batch>-sass.csv); the report itself stays on the machine unless
# it fits the device tool's 16 MB ($OUT/decoder-ncu-b<batch>.ncu-rep).
#   bash scripts/decoder-ncu.sh [batch, default 64] [extra ncu args...]
set -uo pipefail
cd "$(dirname "$0")/.."
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
[ -d gpu-bin ] || python3 -c "import tarfile; tarfile.open('gpu-pack/gpu-bin.tar.xz').extractall()"
export GRAPHED_REQUIRE_CUDA=1
batch=${1:-64}; shift || true
out=${OUT:-/tmp/graphed-out}; mkdir -p "$out"
rep="$out/decoder-ncu-b$batch"
# The profiled launch is the first: the decoder captures its batch buckets largest first, each
# after one eager warm-up step, so with --max-batch at the batch asked for the first launch of
# the kernel is that batch's warm-up (session 27: --launch-skip 8 landed on a smaller bucket's
# warm-up, a launch of the one-row-tile build, 226 registers, where batch 64 runs the main one).
timeout 420 ncu --set full --clock-control none --import-source no --kernel-name decoder_step_bf16 --launch-skip 0 --launch-count 1 \
  --export "$rep" --force-overwrite "$@" \
  gpu-bin/examples/gpt --decode-bench --size gpu --dtype bf16 --prompt-len 64 --max-new-tokens 8 \
  --max-batch "$batch" --bench-min-batch "$batch" --fused-batch-limit 64 > "$rep.log" 2>&1
echo "ncu exit $? ($(grep -c '==PROF==' "$rep.log") profiler lines; log $rep.log)"
if [ -f "$rep.ncu-rep" ]; then
  ncu --import "$rep.ncu-rep" --page details --print-details all > "$rep.txt" 2>&1
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep-sass.csv" 2>/dev/null \
    || { echo "this ncu prints no source page"; rm -f "$rep-sass.csv"; }
  grep -E "Duration|Warp Cycles Per Issued Instruction|Stall|Issue Slot|Achieved Occupancy" "$rep.txt" | head -40
  [ "$(stat -c %s "$rep.ncu-rep")" -le 16000000 ] || rm -f "$rep.ncu-rep"
else
  tail -20 "$rep.log"
fi
