#!/usr/bin/env bash
# Runs on the GPU machine (no pack needed: bench/rows_ncu.py builds the runtime's kernels with
# NVRTC through CuPy): the bf16 row kernels at 4096 x 4096 under Nsight Compute's full set, to
# say what bounds them (on the H200 they take the H100's time; docs/BENCHMARKS.md). Prints each
# kernel's duration, DRAM throughput, occupancy and warp stall lines; the details page of every
# profiled kernel goes to $OUT/rows-ncu.tgz.
#   bash scripts/rows-ncu.sh [seconds, default 240]
NAME=rows-ncu BUDGET=${1:-240}
. "$(dirname "$0")/device-call.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$work/device.txt"
rep="$work/rows"
# Both passes of bench/rows_ncu.py are profiled (ncu flushes the caches before each kernel), 12 kernels.
timeout "$BUDGET" ncu --set full --clock-control none --import-source no \
  --kernel-name regex:"rms_smem_bf16|rms_ring_bwd_bf16|col_partials_acc_f32|sx_smem_bf16|xent_mean_f32|copy" \
  --launch-skip 0 --launch-count 16 --export "$rep" --force-overwrite \
  python3 -u bench/rows_ncu.py > "$rep.log" 2>&1
echo "ncu exit $? ($(grep -c '==PROF==' "$rep.log") profiler lines)"
tail -n 4 "$rep.log"
if [ -f "$rep.ncu-rep" ]; then
  ncu --import "$rep.ncu-rep" --page details --print-details all > "$rep.txt" 2>&1
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Block Limit|One or More Eligible|stalled|Stall" "$rep.txt" | head -150
  rm -f "$rep.ncu-rep"
fi
pack
