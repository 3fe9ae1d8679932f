#!/usr/bin/env bash
# Type-checks the NVRTC kernel sources with the host C++ compiler (no GPU, no CUDA toolkit):
# scripts/cuda-host-shim.h stands in for the CUDA built-ins, inline PTX is skipped. It catches
# syntax and type errors and instantiates every template; it does not replace running on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
k=runtime/backend/kernels
cat scripts/cuda-host-shim.h $k/core.cu $k/ops.cu $k/half.cu $k/scale_update.cu $k/generation.cu $k/mixed.cu $k/multi_tensor.cu $k/transformer.cu $k/flash.cu $k/decode.cu \
  | sed -e 's/extern "C" __global__ void/extern "C" void/' -e 's/asm volatile(/asm(/' -e 's/^extern __shared__ .*fa_smem.*/static unsigned char fa_smem[1 << 18];/' -e 's/^extern __shared__ .*gr_row_smem.*/static float gr_row_smem[1 << 15];/' -e 's/^extern __shared__ .*gr_sx_row.*/static uint4 gr_sx_row[1 << 14];/' > "$tmp/all.cpp"
"${CXX:-g++}" -std=c++17 -DFA_FWD64=64,4,2 -DFA_FWD128=64,4,2 -DFA_DQ64=32,4,2 -DFA_DQ128=64,4,1 -DFA_DKV64=128,4,2 -DFA_DKV128=64,4,1 -DFA_FWDS64=64,4,1 -DFA_DQS64=64,4,1 -DFA_DKVS64=128,4,1 -DRN_FWD_VPT=4 -DRN_BWD_VPT=2 -fsyntax-only -Wall -Wno-unknown-pragmas -Wno-unused-function "$tmp/all.cpp"
# The Hopper attention backward is a program of its own (backend/cuda_hopper.rs, for sm_90a): its
# body is compiled for that architecture only, so the check names it.
for turn in 1 0 2; do
  cat scripts/cuda-host-shim.h $k/core.cu $k/ops.cu $k/half.cu $k/flash.cu $k/flash_hopper.cu bench/hopper_bwd.cu \
    | sed -e 's/extern "C" __global__ void/extern "C" void/' -e 's/asm volatile(/asm(/' -e 's/^extern __shared__ .*fa_smem.*/static unsigned char fa_smem[1 << 18];/' -e 's/^extern __shared__ .*gr_sx_row.*/static uint4 gr_sx_row[1 << 14];/' > "$tmp/hopper.cpp"
  "${CXX:-g++}" -std=c++17 -D__CUDA_ARCH__=900 -D__CUDA_ARCH_FEAT_SM90_ALL -DHB_TURN=$turn -DFA_FWD64=64,4,2 -DFA_FWD128=64,4,2 -DFA_DQ64=32,4,2 -DFA_DQ128=64,4,1 -DFA_DKV64=128,4,2 -DFA_DKV128=64,4,1 -DFA_FWDS64=64,4,1 -DFA_DQS64=64,4,1 -DFA_DKVS64=128,4,1 -fsyntax-only -Wall -Wno-unknown-pragmas -Wno-unused-function "$tmp/hopper.cpp"
done
# The conditional-node kernel is a program of its own (backend/cuda_graph.rs compiles it apart).
{ cat scripts/cuda-host-shim.h; echo '#define __device_builtin__'; echo '#define __cudart_builtin__'; cat $k/scale_update.cu $k/generation.cu $k/conditional.cu; } \
  | sed -e 's/extern "C" __global__ void/extern "C" void/' > "$tmp/conditional.cpp"
"${CXX:-g++}" -std=c++17 -fsyntax-only -Wall -Wno-unknown-pragmas -Wno-unused-function "$tmp/conditional.cpp"
# The one-kernel decoding step is a program of its own too (backend/cuda_decoder.rs), compiled per
# model shape: the GPT's (d_model 512, 8 heads, hidden 1368), head dim 128, and the GPT's with
# the stage trace compiled in.
for shape in "512 8 1368" "1024 8 2048" "512 8 1368 -DFD_TRACE" "512 8 1368 -DFD_WPASS_MIN=4" "512 8 1368 -DFD_CLUSTER=16" "512 8 1368 -DFD_CLUSTER=16 -DFD_DSMEM=1"; do
  set -- $shape
  cat scripts/cuda-host-shim.h $k/core.cu $k/ops.cu $k/half.cu $k/decoder.cu \
    | sed -e 's/extern "C" __global__ void/extern "C" void/' -e 's/asm volatile(/asm(/' \
      -e 's/^extern __shared__ .*fd_wbuf.*/static u32 fd_wbuf[1 << 14];/' -e 's/^extern __shared__ .*gr_sx_row.*/static uint4 gr_sx_row[1 << 14];/' > "$tmp/decoder.cpp"
  "${CXX:-g++}" -std=c++17 -DFD_D=$1 -DFD_HEADS=$2 -DFD_HID=$3 -DFD_WBUF_BYTES=114688 -DFD_ABUF_BYTES=65536 ${4:-} ${5:-} -fsyntax-only -Wall -Wno-unknown-pragmas -Wno-unused-function "$tmp/decoder.cpp"
done
# bench/decode_probe.cu (the decoding step's primitives, measured apart by bench/decode_probe.py).
for cs in 8 16; do
  { cat scripts/cuda-host-shim.h; cat bench/decode_probe.cu; } \
    | sed -e 's/extern "C" __global__ void/extern "C" void/' -e 's/asm volatile(/asm(/' \
      -e 's/^extern __shared__ uint4 dp_smem\[\];/static uint4 dp_smem[1 << 14];/' > "$tmp/probe.cpp"
  "${CXX:-g++}" -std=c++17 -DCS=$cs -fsyntax-only -Wall -Wno-unknown-pragmas -Wno-unused-function -Wno-unused-variable "$tmp/probe.cpp"
done
echo "kernels type-check"
