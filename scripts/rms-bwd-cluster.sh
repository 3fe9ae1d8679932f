#!/usr/bin/env bash
# One device call (after scripts/gpu-build.sh; carry gpu-pack): the bf16 RMSNorm backward in
# thread block clusters (`rms_ring_bwd_cl_bf16`, GRAPHED_RMS_BWD_CLUSTER) against the plain ring
# kernel. Its tests with clusters of 8 (CUDA required), op_bench's RMSNorm backward at each
# cluster size in turn, twice over (1 is the plain kernel: the order's own drift shows), then
# compute-sanitizer memcheck and racecheck on the cluster test. Logs go to $OUT.
#   bash scripts/rms-bwd-cluster.sh [cluster sizes, default "1 8 4"]
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d gpu-bin ] || python3 -c "import tarfile; tarfile.open('gpu-pack/gpu-bin.tar.xz').extractall()"
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
export GRAPHED_REQUIRE_CUDA=1
out=${OUT:-/tmp/graphed-out}; mkdir -p "$out"
sizes=${1:-1 8 4}
t0=$(date +%s)
note() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
note "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
GRAPHED_RMS_BWD_CLUSTER=8 GRAPHED_CLUSTER_DEBUG=1 timeout 120 gpu-bin/tests/ops_transformer --test-threads=1 > "$out/ops_transformer.log" 2>&1
echo "ops_transformer (clusters of 8): exit $?"
grep -E "^test result|FAILED|panicked|blocks a cluster" "$out/ops_transformer.log" | sort | uniq -c
for pass in 1 2; do
  for n in $sizes; do
    GRAPHED_RMS_BWD_CLUSTER=$n timeout 60 gpu-bin/examples/op_bench --only rms_norm_backward > "$out/op_bench_cl${n}_$pass.log" 2>&1
    note "pass $pass, $n blocks a cluster:"
    grep -E "^ *(rms_norm_backward|add_rms_norm_backward) " "$out/op_bench_cl${n}_$pass.log"
  done
done
for tool in memcheck racecheck; do
  GRAPHED_RMS_BWD_CLUSTER=8 timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 3 gpu-bin/tests/ops_transformer \
    --test-threads=1 rms_norm_bf16_backward_over add_rms_norm_equals > "$out/sanitize-$tool.log" 2>&1
  note "$tool: exit $?"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^test result" "$out/sanitize-$tool.log" | tail -2
done
note "done"
