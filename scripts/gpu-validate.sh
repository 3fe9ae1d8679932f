#!/usr/bin/env bash
# One H200 call that checks a change end to end (after scripts/gpu-build.sh; carry gpu-pack):
# every test binary with CUDA required, compute-sanitizer on the fused attention and the fault
# sweep, the attention benchmarks (ours through the runtime, PyTorch's SDPA beside the same
# kernels), and the GPT at three contexts of 4096 tokens a step against PyTorch's per-layer
# graphs and torch.compile. Logs go to $OUT as one tarball (the device tool returns few files)
# plus the summary on stdout.
#   bash scripts/gpu-validate.sh tests|bench|kernels|kernels+bench|decode|all [gpt-steps]
# (GRAPHED_SKIP_ATTENTION=1 and GRAPHED_SKIP_SWEEP=1 leave out the attention benchmarks and the
# row-kernel sweep.)
# (tests: the test binaries, the sanitizers, the main job; bench: the benchmarks; kernels: the
# row-kernel sweep, the op benchmark and the GPT's sequence buckets; decode: GPT decoding against
# PyTorch's compiled decode, the optimizer step's figures and the replay issue cost. Each part fits
# one device call.)
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d gpu-bin ] || python3 -c "import tarfile; tarfile.open('gpu-pack/gpu-bin.tar.xz').extractall()"
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp/graphed-out}; logs=$(mktemp -d); mkdir -p "$out"
part=${1:-all}; steps=${2:-300}
fail=0
t0=$(date +%s)
note() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

note "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
if [ "$part" = tests ] || [ "$part" = all ]; then
note "test binaries (GRAPHED_REQUIRE_CUDA=1)"
passed=0; failed=0
for t in gpu-bin/tests/*; do
  n=$(basename "$t")
  GRAPHED_REQUIRE_CUDA=1 "$t" --test-threads=1 > "$logs/test-$n.log" 2>&1 || { fail=1; echo "FAILED: $n"; grep -E "panicked|FAILED" "$logs/test-$n.log" | head -5; }
  p=$(grep -E "^test result" "$logs/test-$n.log" | sed -E 's/.* ([0-9]+) passed; ([0-9]+) failed.*/\1 \2/' | awk '{p+=$1; f+=$2} END {print p+0, f+0}')
  passed=$((passed + ${p% *})); failed=$((failed + ${p#* }))
done
note "tests: $passed passed, $failed failed"
for t in faults checkpoint_fuzz; do
  GRAPHED_REQUIRE_CUDA=1 timeout 120 "gpu-bin/tests/$t" --test-threads=1 --nocapture > "$logs/nocapture-$t.log" 2>&1
  grep -h -E "fault point|swept|inputs|refused" "$logs/nocapture-$t.log" | head -4
done
GRAPHED_REQUIRE_CUDA=1 gpu-bin/tests/runtime capabilities --nocapture 2>&1 | grep -viE "^(running|test |$)" | head -8

# The fault sweep provokes out-of-memory on purpose: the driver's refusals are not reported as
# errors there (--report-api-errors no), the memory checks are.
# racecheck runs the portable attention kernels only (GRAPHED_ATTENTION=portable): on cuDNN's
# Hopper kernels it reports hazards between accesses that their mbarrier synchronisation orders
# (racecheck does not follow mbarriers); memcheck runs both engines.
for spec in "memcheck ops_flash all auto" "racecheck ops_flash all portable" "memcheck faults no auto"; do
  set -- $spec
  note "compute-sanitizer $1 $2 (attention engine: $4)"
  GRAPHED_ATTENTION=$4 GRAPHED_REQUIRE_CUDA=1 timeout 150 compute-sanitizer --tool "$1" --report-api-errors "$3" --error-exitcode 3 "gpu-bin/tests/$2" --test-threads=1 > "$logs/sanitize-$1-$2.log" 2>&1 || { fail=1; echo "FAILED: $1 $2"; }
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^test result" "$logs/sanitize-$1-$2.log" | tail -2
done

note "the main job (defaults: 2000 steps, graphed, odd blocks checkpointed)"
gpu-bin/examples/gpt --help > "$logs/gpt-help.txt" 2>&1
gpu-bin/examples/gpt --plot "$out/gpt-loss.png" --json "$logs/gpt-main.json" > "$logs/gpt-main.log" 2>&1 || { fail=1; echo "FAILED: main job"; }
grep -E "^(GPT on|captured|step +2000|trained)" "$logs/gpt-main.log"
fi
if [ "$part" = kernels ] || [ "$part" = all ] || [ "$part" = kernels+bench ]; then
if [ -z "${GRAPHED_SKIP_SWEEP:-}" ]; then
note "row kernels: the NVRTC sweep (RMSNorm, residual + RMSNorm, dropout)"
timeout 240 python3 gpu-bin/bench/row_sweep.py --quick --out "$logs" > "$logs/row_sweep.log" 2>&1 || { fail=1; echo "FAILED: row_sweep"; }
tail -40 "$logs/row_sweep.log"
fi
note "op benchmark (each kernel against its floor)"
timeout 180 gpu-bin/examples/op_bench > "$logs/op_bench.log" 2>&1 || { fail=1; echo "FAILED: op_bench"; }
tail -45 "$logs/op_bench.log"
note "GPT sequence buckets: ragged rows at context 4096, 8 buckets from 128 against every step padded to 4096"
for b in 8 1; do
  timeout 200 gpu-bin/examples/gpt --steps "$steps" --eval-every 100000 --context 4096 --batch 1 --lengths ragged --buckets $b \
    --bucket-min 128 --estimate --json "$logs/gpt_ragged_b$b.json" > "$logs/gpt_ragged_b$b.log" 2>&1 || { fail=1; echo "FAILED: gpt ragged $b"; tail -3 "$logs/gpt_ragged_b$b.log"; }
  grep -E "estimat|captured|sequence bucket|^trained|ragged rows" "$logs/gpt_ragged_b$b.log"
done
timeout 120 gpu-bin/examples/gpt --steps 50 --eval-every 100000 --context 4096 --batch 1 --json "$logs/gpt_fixed_4096.json" > "$logs/gpt_fixed_4096.log" 2>&1 || fail=1
grep -E "^captured|^trained" "$logs/gpt_fixed_4096.log"
fi
if [ "$part" = bench ] || [ "$part" = all ] || [ "$part" = kernels+bench ]; then
if [ -z "${GRAPHED_SKIP_ATTENTION:-}" ]; then
note "attention benchmark through the runtime"
gpu-bin/examples/attention_bench --json "$out/attention_bench.json" > "$logs/attention_bench.log" 2>&1 || fail=1
tail -22 "$logs/attention_bench.log"
note "PyTorch SDPA beside the same kernels"
python3 gpu-bin/bench/flash_sweep.py --no-sweep --quick --out "$logs" > "$logs/flash_sweep.log" 2>&1 || { fail=1; echo "FAILED: flash_sweep"; }
grep -E "correctness|FAIL|^\|" "$logs/flash_sweep.log" | tail -24
fi

for shape in 256x16 1024x4 4096x1; do
  ctx=${shape%x*}; batch=${shape#*x}
  note "GPT ${ctx} x ${batch}"
  for mode in graphed floor; do
    gpu-bin/examples/gpt --steps "$steps" --eval-every 100000 --mode $mode --no-checkpoint --context "$ctx" --batch "$batch" \
      --plot "$logs/gpt_${mode}_${shape}.png" --json "$logs/gpt_${mode}_${shape}.json" > "$logs/gpt_${mode}_${shape}.log" 2>&1 \
      || { fail=1; echo "FAILED: gpt $mode $shape"; tail -3 "$logs/gpt_${mode}_${shape}.log"; }
    grep -E "^trained" "$logs/gpt_${mode}_${shape}.log"
  done
  # The blocks that recompute SwiGLU's output, or it and the norms' outputs (less pool, one
  # more write or pass each).
  for r in swiglu all; do
    gpu-bin/examples/gpt --steps "$steps" --eval-every 100000 --mode graphed --no-checkpoint --recompute $r --context "$ctx" \
      --batch "$batch" --json "$logs/gpt_recompute-${r}_${shape}.json" > "$logs/gpt_recompute-${r}_${shape}.log" 2>&1 \
      || { fail=1; echo "FAILED: gpt recompute $r $shape"; tail -3 "$logs/gpt_recompute-${r}_${shape}.log"; }
    grep -E "^trained" "$logs/gpt_recompute-${r}_${shape}.log"
  done
  if [ "$shape" = 256x16 ]; then
    gpu-bin/examples/gpt --steps "$steps" --eval-every 100000 --mode graphed --no-checkpoint --attention unfused \
      --json "$logs/gpt_unfused_${shape}.json" > "$logs/gpt_unfused_${shape}.log" 2>&1 || { fail=1; echo "FAILED: gpt unfused"; }
    grep -E "^trained" "$logs/gpt_unfused_${shape}.log"
  fi
  python3 gpu-bin/bench/pytorch_gpt_bench.py --steps "$steps" --dtype bf16 --context "$ctx" --batch "$batch" \
    --variants compile --out "$logs/gpt_torch_${shape}.json" 2>&1 | grep -E "^\[torch" || fail=1
done
fi
if [ "$part" = decode ] || [ "$part" = all ]; then
note "GPT decoding: ours (WHILE loop, per-token replay, eager) then PyTorch's compiled decode, batch 1..64"
OUT="$logs" timeout 400 bash scripts/gpt-decode-bench.sh 64 128 > "$logs/decode_bench.log" 2>&1 || { fail=1; echo "FAILED: decode bench"; tail -5 "$logs/decode_bench.log"; }
grep -vE "^\[|^ *$" "$logs/decode_bench.log" | tail -30
cp "$logs"/decode_bench.md "$logs"/decode_*.json "$logs"/decode_bench.png "$out/" 2>/dev/null
note "optimizer step: multi-tensor AdamW and the loss scaler's IF node"
timeout 120 gpu-bin/examples/op_bench --optimizer > "$logs/op_bench_optimizer.log" 2>&1 || { fail=1; echo "FAILED: op_bench --optimizer"; }
tail -16 "$logs/op_bench_optimizer.log"
note "replay issue cost (examples/bench)"
timeout 120 gpu-bin/examples/bench > "$logs/bench.log" 2>&1 || { fail=1; echo "FAILED: bench"; }
grep -iE "issue|replay" "$logs/bench.log" | head -12
fi
cat "$logs"/gpt_*.json > "$out/gpt_runs.jsonl" 2>/dev/null
tar -C "$logs" -czf "$out/logs.tar.gz" .
note "done (fail=$fail)"
exit $fail
