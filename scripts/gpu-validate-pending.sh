#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-build.sh (carry gpu-pack): the checks of the code
# that sessions 15 to 21 wrote on the development machine and no GPU has run yet, most
# important first, each under a time limit so that one call (600 s) gets through as much as it
# can. docs/BENCHMARKS.md ("The next device calls") says what each one is for.
#   1. the test binaries that hold the new code, on CUDA (GRAPHED_REQUIRE_CUDA=1);
#   2. bench/decode_probe.py (the decoding step's primitives; under a minute, 120 s at most);
#   3. the same generation tests with the WHILE condition set by a kernel of its own
#      (GRAPHED_FOLD_CONDITION=0; the fold is the default);
#   4. the decoder step's tests as one cluster (GRAPHED_DECODER_CLUSTER=16, then with its stage
#      outputs pushed into every block's shared memory, GRAPHED_DECODER_DSMEM=1), then on the former
#      64/96 KiB buffers (GRAPHED_DECODER_WBUF/ABUF);
#   4s. the decoder step's tests and gpt_generate without the kernel's second build (batches of
#      at most 16 on the main build, GRAPHED_DECODER_SMALL=0; the second build is the default);
#   4b/4c. ops_transformer and gpt with the RMSNorm kernels' register forms (GRAPHED_ROW_RING=0), the
#      GEMM tests and gpt with the plain GEMMs through cublasLt, timed (GRAPHED_GEMM=tuned),
#      ops_flash and gpt with cuDNN's attention plans timed (GRAPHED_ATTENTION_TUNE=1);
#   5. every other test binary, while time is left.
# A progress line a step; the logs and a summary go to $OUT/validate-pending.tgz (the device
# tool brings back at most 8 files). Exit status: 0 when every step that ran passed.
# STEPS="1 5" runs only those steps (default: all, "1 2 3 4 4s 4b 4c 5").
#   bash scripts/gpu-validate-pending.sh [seconds, default 540]
NAME=validate-pending BUDGET=${1:-540}
. "$(dirname "$0")/device-call.sh"
fail=0
steps=" ${STEPS:-1 2 3 4 4s 4b 4c 5} "
want() { [[ "$steps" == *" $1 "* ]]; }
done_bins=" "
runs=0
# run NAME [ENV=VALUE ...] [-- test filter]: one test binary, one test at a time, its log kept.
run() {
  local name=$1; shift
  local envs=() filter=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ "${1:-}" = -- ] && { shift; filter=("$@"); }
  # A run number in the log's name: the same binary under other settings keeps its own log.
  runs=$((runs + 1))
  local bin=gpu-bin/tests/$name tag=$(printf '%02d' "$runs")-$name
  [ -x "$bin" ] || { say "SKIP $name: not in the pack"; return; }
  local limit; limit=$(left)
  [ "$limit" -gt 20 ] || { say "SKIP $name ${envs[*]}: out of time"; return; }
  [ "$limit" -gt 240 ] && limit=240
  if env "${envs[@]}" timeout "$limit" "$bin" --test-threads=1 "${filter[@]}" > "$work/$tag.log" 2>&1; then
    say "ok   $name ${envs[*]} ${filter[*]} ($(grep -E '^test result' "$work/$tag.log" | tail -1))"
  else
    fail=1
    say "FAIL $name ${envs[*]} ${filter[*]}"
    grep -E "panicked|FAILED|error" "$work/$tag.log" | head -8 | tee -a "$work/summary.txt"
  fi
  done_bins+="$name "
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$work/gpu.txt"
want 1 && say "1. the binaries with session 15-22 code"
want 1 && for t in misuse faults ops_half ops_activation ops_decoder_step macro_kv_state forward_only multi_tensor mixed_precision ops_generate conditional gpt_generate gpt ops_transformer ops_linear ops_flash ops_columns; do
  run "$t"
done
pack
want 2 && say "2. the decode probe"
want 2 && if timeout 120 python3 bench/decode_probe.py --out "$work" > "$work/decode_probe.log" 2>&1; then
  say "ok   decode_probe ($(grep -c . "$work/decode_probe.log") lines)"
else
  fail=1
  say "FAIL decode_probe"
  tail -5 "$work/decode_probe.log" | tee -a "$work/summary.txt"
fi
pack
want 3 && say "3. the generation tests with GRAPHED_FOLD_CONDITION=0 (the separate condition kernel)"
want 3 && for t in ops_generate gpt_generate conditional; do
  run "$t" GRAPHED_FOLD_CONDITION=0
done
pack
if want 4; then
  say "4. the decoder step as one cluster of 16 blocks (GRAPHED_DECODER_CLUSTER), then on the former 64/96 KiB buffers"
  run ops_decoder_step GRAPHED_DECODER_CLUSTER=16
  run gpt_generate GRAPHED_DECODER_CLUSTER=16
  run ops_decoder_step GRAPHED_DECODER_CLUSTER=16 GRAPHED_DECODER_DSMEM=1
  run gpt_generate GRAPHED_DECODER_CLUSTER=16 GRAPHED_DECODER_DSMEM=1
  run ops_decoder_step GRAPHED_DECODER_WBUF=65536 GRAPHED_DECODER_ABUF=98304
fi
want 4s && say "4s. batches of at most 16 on the decoder's main build (GRAPHED_DECODER_SMALL=0; the one-row-tile build is the default since session 26)"
want 4s && for t in ops_decoder_step gpt_generate; do
  run "$t" GRAPHED_DECODER_SMALL=0
done
want 4b && say "4b. the RMSNorm kernels' register forms (GRAPHED_ROW_RING=0; the ring forms are the default)"
want 4b && for t in ops_transformer gpt; do
  run "$t" GRAPHED_ROW_RING=0
done
want 4c && say "4c. the plain GEMMs through cublasLt, timed (GRAPHED_GEMM=tuned), and cuDNN's attention plans timed"
want 4c && for t in ops_linear ops_half mixed_precision gpt; do
  run "$t" GRAPHED_GEMM=tuned
done
want 4c && for t in ops_flash gpt; do
  run "$t" GRAPHED_ATTENTION_TUNE=1 GRAPHED_CUDNN_DEBUG=1
done
pack
want 5 && say "5. the rest of the suite"
want 5 && for bin in gpu-bin/tests/*; do
  name=$(basename "$bin")
  [[ "$done_bins" == *" $name "* ]] && continue
  run "$name"
done
say "done: $([ $fail = 0 ] && echo 'every step that ran passed' || echo 'FAILURES above')"
pack
exit $fail
