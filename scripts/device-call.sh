# Sourced by the scripts that run a whole device call on the GPU machine (after scripts/gpu-build.sh,
# carry gpu-pack, or no pack for a script that builds its own kernels): CUDA's environment, the
# pack unpacked where there is one, CUDA required, NVLink multicast off, and
# a time budget with progress lines. Set NAME (the logs' folder and the archive's name) and
# BUDGET (seconds) before sourcing; gives $work (the logs' folder), left (seconds of the budget
# left), say (a progress line, also kept in $work/summary.txt) and pack ($work as
# $OUT/$NAME.tgz: the device tool brings back at most 8 files).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/cuda-env.sh
[ -d gpu-bin ] || [ ! -f gpu-pack/gpu-bin.tar.xz ] || python3 -c "import tarfile; tarfile.open('gpu-pack/gpu-bin.tar.xz').extractall()"
export GRAPHED_REQUIRE_CUDA=1 NCCL_NVLS_ENABLE=0
work=$(mktemp -d)/$NAME; mkdir -p "$work"
t0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
say() { echo "[+$(( $(date +%s) - t0 ))s] $*" | tee -a "$work/summary.txt"; }
pack() { [ -n "${OUT:-}" ] && tar -czf "$OUT/$NAME.tgz" -C "$(dirname "$work")" "$NAME"; }
