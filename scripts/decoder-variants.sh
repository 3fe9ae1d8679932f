#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-build.sh (carry gpu-bin, or its packed form, and the
# variant files): the one-kernel decoding step's versions side by side, each compiled from a
# named source file through GRAPHED_DECODER_SOURCE (the word `builtin` is the kernel built into
# the binaries), with the same binaries:
#   bash scripts/decoder-variants.sh [builtin] variants/a.cu variants/b.cu wpass4:GRAPHED_DECODER_WPASS=4 ...
# (NAME:VAR=VALUE,VAR=VALUE is the built-in kernel with those variables set: the knobs of
# runtime/backend/cuda_decoder.rs.)
# For each version: `gpt --decode-bench` with the one kernel at every batch (--fused-batch-limit
# 64), and with DECODER_TESTS=1 the step tests and gpt_generate on it (DECODER_TESTS=NAME: on
# the version NAME only, `builtin` or a file's name without .cu, to save device time); with
# DECODER_TRACE=1 its stage trace at batches 64, 32 and 1 (bench/decoder_trace.py). With
# DECODER_TORCH=1,2,... PyTorch's compiled decode at those batches once. Then one table of ms a
# token by batch and version (bench/decode_variants.py). DECODER_REPEAT=1 times the first version
# once more at the end (its benchmark only: no tests or trace a second time). Everything goes
# into $OUT/decoder-variants.tgz: the device tool brings back at most 8 files. The first
# version's first run compiles the kernel and cuBLAS's plans on a fresh machine: its time limit
# is 150 s, the others' 90 s.
set -uo pipefail
cd "$(dirname "$0")/.."
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
[ -d gpu-bin ] || python3 -c "import tarfile; tarfile.open('gpu-pack/gpu-bin.tar.xz').extractall()"
export GRAPHED_REQUIRE_CUDA=1
work=$(mktemp -d)/decoder-variants; mkdir -p "$work"
t0=$(date +%s)
say() { echo "[+$(( $(date +%s) - t0 ))s] $*"; }
pack() {
  python3 bench/decode_variants.py "$work" > "$work/summary.txt" 2>&1
  [ -n "${OUT:-}" ] && tar -czf "$OUT/decoder-variants.tgz" -C "$(dirname "$work")" decoder-variants
}
limit=150
n=0
# DECODER_REPEAT=1 runs the first version once more at the end: a call's own measure of run
# order and drift, since every ratio in the table is against the first (session 29, call 4: every
# version ran 2% to 4.5% slower than the first at batches 1 to 4, one of them differing only in a
# constant on that path, and the call had no second run of the first to tell drift from code).
repeat=0
[ "${DECODER_REPEAT:-0}" = 1 ] && [ $# -gt 0 ] && { set -- "$@" "$1"; repeat=$#; }
for v in "$@"; do
  n=$((n + 1))
  if [[ "$v" == *:* ]]; then
    name="$n-${v%%:*}"; IFS=, read -ra vars <<< "${v#*:}"; src=(env "${vars[@]}")
  else
    name="$n-$(basename "$v" .cu)"
    src=(env); [ "$v" != builtin ] && src=(env "GRAPHED_DECODER_SOURCE=$v")
  fi
  say "decode $name"
  "${src[@]}" timeout "$limit" gpu-bin/examples/gpt --decode-bench --size gpu --dtype bf16 --prompt-len 64 --max-new-tokens 128 \
    --max-batch 64 --fused-batch-limit 64 --json "$work/dec_$name.json" > "$work/dec_$name.log" 2>&1
  echo "exit $?"
  limit=90
  [ "$n" = "$repeat" ] && { pack; continue; }  # the repeat: its benchmark only
  if [ "${DECODER_TESTS:-0}" = 1 ] || [ "${DECODER_TESTS:-0}" = "${name#*-}" ]; then
    say "tests on $name"
    "${src[@]}" timeout 150 gpu-bin/tests/ops_decoder_step --test-threads=1 > "$work/test_step_$name.txt" 2>&1; echo "exit $?"
    "${src[@]}" timeout 90 gpu-bin/tests/gpt_generate --test-threads=2 > "$work/test_gen_$name.txt" 2>&1; echo "exit $?"
    grep -h "test result" "$work/test_step_$name.txt" "$work/test_gen_$name.txt"
  fi
  if [ "${DECODER_TRACE:-0}" = 1 ]; then
    say "trace of $name"
    mkdir -p "$work/trace_$name"
    "${src[@]}" GRAPHED_DECODER_TRACE="$work/trace_$name" timeout 150 gpu-bin/examples/gpt --decode-bench --size gpu --dtype bf16 \
      --prompt-len 64 --max-new-tokens 8 --max-batch 64 --fused-batch-limit 64 > "$work/trace_$name.log" 2>&1
    for b in 64 32 1; do
      f="$work/trace_$name/decoder-trace-b$b.bin"
      [ -f "$f" ] && python3 bench/decoder_trace.py "$f"
    done > "$work/trace_$name.txt" 2>&1
    rm -rf "$work/trace_$name"
  fi
  pack
done
if [ -n "${DECODER_TORCH:-}" ]; then
  say "PyTorch at batches $DECODER_TORCH"
  PYTHONUNBUFFERED=1 timeout 200 python3 bench/pytorch_gpt_decode.py --prompt-len 64 --new-tokens 128 --batches "$DECODER_TORCH" \
    --out "$work/torch.json" > "$work/torch.log" 2>&1
  echo "exit $?"
fi
pack
cat "$work/summary.txt"
say done
