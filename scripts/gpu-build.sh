#!/usr/bin/env bash
# Builds the test binaries and examples in release mode and puts them in gpu-bin/ (git-ignored),
# ready to travel to the GPU machine (which has CUDA but no cargo). Then run there:
#   bash scripts/gpu-run.sh            (device tool: carry ["gpu-bin"])
# GPU_TESTS="ops_decoder_step gpt_generate" and GPU_EXAMPLES="gpt" build only those test targets
# and examples (minutes instead of the whole suite, for a call that measures one change).
set -euo pipefail
cd "$(dirname "$0")/.."
# Every NVRTC program compiles and assembles for sm_90 before a pack is built (exit 2: NVRTC
# could not be installed here, said and skipped): a GPU call must never be spent on a kernel that
# does not build. GPU_BUILD_NVRTC=0 skips it.
if [ "${GPU_BUILD_NVRTC:-1}" != 0 ]; then
  nvrtc=0; python3 scripts/nvrtc-check.py || nvrtc=$?
  [ "$nvrtc" -eq 0 ] || [ "$nvrtc" -eq 2 ] || { echo "gpu-build: the kernels do not build (scripts/nvrtc-check.py)"; exit 1; }
fi
rm -rf gpu-bin && mkdir -p gpu-bin/tests gpu-bin/examples
tests=(); for t in ${GPU_TESTS:-}; do tests+=(--test "$t"); done
examples=(--examples); if [ -n "${GPU_EXAMPLES:-}" ]; then examples=(); for e in $GPU_EXAMPLES; do examples+=(--example "$e"); done; fi
cargo test --release --no-run "${tests[@]}" --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] != ["proc-macro"] and m.get("profile", {}).get("test"):
        name = m["target"]["name"]
        # trybuild needs cargo, and the snapshot tests of the macro crate read source files: both run
        # on the development machine only.
        if name in ("ui",) or "graphed-macros" in m.get("package_id", ""):
            continue
        dst = os.path.join("gpu-bin/tests", name if m["target"]["kind"] != ["lib"] else "lib-" + name)
        shutil.copy(m["executable"], dst)
        print("test binary:", dst)
'
cargo build --release "${examples[@]}"
for f in examples/*.rs examples/*/main.rs; do
  case "$f" in */main.rs) n=$(basename "$(dirname "$f")") ;; *) n=$(basename "$f" .rs) ;; esac
  [ "$n" = common ] && continue
  if [ -n "${GPU_EXAMPLES:-}" ] && [[ " $GPU_EXAMPLES " != *" $n "* ]]; then continue; fi
  cp "target/release/examples/$n" gpu-bin/examples/ && echo "example: gpu-bin/examples/$n"
done
[ -d bench ] && cp -r bench gpu-bin/ && rm -rf gpu-bin/bench/__pycache__
du -sh gpu-bin
# The device tool carries at most 64 MiB: pack the binaries (about 10 MB with xz). There:
#   python3 -c "import tarfile; tarfile.open('gpu-pack/gpu-bin.tar.xz').extractall()"
mkdir -p gpu-pack && tar -cf - gpu-bin | xz -T2 -6 > gpu-pack/gpu-bin.tar.xz && du -sh gpu-pack/gpu-bin.tar.xz
