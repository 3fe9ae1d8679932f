#!/usr/bin/env python3
"""Compiles every NVRTC program of the CUDA backend (and the bench programs that CuPy compiles on
the GPU machine) with the real NVRTC and assembles it with ptxas for the H200 (sm_90), on a
machine with no GPU and no CUDA toolkit.

The programs and their exact options come from the runtime itself (the test
`backend::programs::every_program_is_listed_and_written_where_asked`, with
GRAPHED_DUMP_PROGRAMS set). NVRTC and ptxas come from NVIDIA's pip wheels
(nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvcc-cu12), installed into a virtual environment the first
time. This catches what the host compiler's type-check (scripts/check-kernels.sh) cannot: inline
PTX, instructions the architecture lacks, and it reports each kernel's registers, spills and
static shared memory, and checks that a kernel's static shared memory plus the dynamic shared
memory the runtime launches it with fits a block (227 KiB on sm_90).

    python3 scripts/nvrtc-check.py [--venv DIR] [--out DIR] [--arch sm_90] [--show REGEX]

Exit status: 0 when every program compiles and assembles and every launch fits; 1 otherwise;
2 when NVRTC or ptxas cannot be had (no network for pip): then nothing was checked, and it says so.
"""
import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The bench programs compiled on the GPU machine by CuPy's NVRTC: name, file, defines (each as
# the script builds it), and the runtime program whose source and options come first (or None).
BENCH = [
    ("probe", "bench/decode_probe.cu", [], None),
    ("probe-cs2", "bench/decode_probe.cu", ["CS=2"], None),
    ("probe-cs16", "bench/decode_probe.cu", ["CS=16"], None),
    ("probe-bulk8", "bench/decode_probe.cu", ["STAGES=8"], None),
    ("xent-variants", "bench/xent_variants.cu", [], "main"),
    ("xent-fold", "bench/xent_fold.cu", [], "main"),
    ("hopper-layout", "bench/hopper_bwd.cu", [], "flash-hopper"),
    ("row-tma", "bench/row_tma.cu", [], None),
    ("row-tma-8", "bench/row_tma.cu", ["RT_STAGES=8"], None),
]
# The most shared memory a block may have on sm_90 (H100, H200): 227 KiB.
OPTIN_SM90 = 232448


def setup(venv):
    """NVRTC's library and ptxas from the pip wheels in `venv`, installed if missing."""
    def find():
        libs = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*"))
        ptxas = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "cuda_nvcc", "bin", "ptxas"))
        libs = [l for l in libs if "alt" not in os.path.basename(l)]
        return (libs[0], ptxas[0]) if libs and ptxas else None
    found = find()
    if found:
        return found
    print(f"installing NVRTC and ptxas (pip wheels) into {venv} ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        pip = os.path.join(venv, "bin", "pip")
        subprocess.run([pip, "install", "-q", "nvidia-cuda-nvrtc-cu12==12.9.*", "nvidia-cuda-nvcc-cu12==12.9.*"], check=True)
    except (subprocess.CalledProcessError, OSError) as e:
        print(f"nvrtc-check skipped: could not install NVRTC and ptxas ({e})")
        sys.exit(2)
    found = find()
    if not found:
        print("nvrtc-check skipped: the wheels did not hold libnvrtc and ptxas")
        sys.exit(2)
    return found


def dump(out):
    """The runtime's programs, written into `out` by its own test."""
    env = dict(os.environ, GRAPHED_DUMP_PROGRAMS=out)
    cmd = ["cargo", "test", "--release", "--lib", "--", "every_program_is_listed_and_written_where_asked", "--nocapture"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
        print("FAIL: the runtime's test did not write the programs")
        sys.exit(1)


def nvrtc_compile(lib, name, src, opts):
    """PTX of `src` under `opts`, or (None, log)."""
    prog = ctypes.c_void_p()
    r = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), (name + ".cu").encode(), 0, None, None)
    if r != 0:
        return None, f"nvrtcCreateProgram: {r}"
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if r != 0:
        return None, log.value.decode(errors="replace")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode(), log.value.decode(errors="replace")


def assemble(ptxas, ptx_path, arch):
    """ptxas -v's per-kernel resources: {kernel: dict(regs, spill_st, spill_ld, smem)}, or raise."""
    cubin = ptx_path[:-4] + ".cubin"
    r = subprocess.run([ptxas, f"-arch={arch}", "-v", ptx_path, "-o", cubin], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-4000:])
    kernels, current = {}, None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = m.group(1)
            kernels[current] = dict(regs=0, spill_st=0, spill_ld=0, smem=0)
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            kernels[current]["spill_st"], kernels[current]["spill_ld"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            kernels[current]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            kernels[current]["smem"] = int(s.group(1)) if s else 0
    return kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=os.path.join(ROOT, "target", "nvrtc-venv"))
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "nvrtc-programs"))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--show", default=None, help="a regex: also print each matching kernel's registers, spills and shared memory")
    a = ap.parse_args()
    libpath, ptxas = setup(a.venv)
    lib = ctypes.CDLL(libpath)
    os.makedirs(a.out, exist_ok=True)
    for f in glob.glob(os.path.join(a.out, "*")):
        os.remove(f)
    dump(a.out)
    for name, path, defines, after in BENCH:
        src, opts = open(os.path.join(ROOT, path)).read(), ["-std=c++17", "--gpu-architecture=sm_90"]
        if after is not None:
            src = open(os.path.join(a.out, after + ".cu")).read() + "\n" + src
            opts = [o for o in open(os.path.join(a.out, after + ".opts")).read().splitlines() if o]
        open(os.path.join(a.out, name + ".cu"), "w").write(src)
        opts += [f"-D{d}" for d in defines]
        open(os.path.join(a.out, name + ".opts"), "w").write("\n".join(opts) + "\n")
    failed = False
    print(f"{'program':<20} {'kernels':>7} {'max regs':>8} {'max static smem':>15}  spills / launch checks")
    for src_path in sorted(glob.glob(os.path.join(a.out, "*.cu"))):
        name = os.path.basename(src_path)[:-3]
        opts = [o for o in open(os.path.join(a.out, name + ".opts")).read().splitlines() if o]
        opts = [re.sub(r"sm_\d+", a.arch, o) if o.startswith("--gpu-architecture") else o for o in opts]
        # A program for the architecture-specific target (sm_90a: wgmma) assembles for it.
        arch = a.arch + ("a" if any(o.startswith("--gpu-architecture") and o.endswith("a") for o in opts) else "")
        ptx, log = nvrtc_compile(lib, name, open(src_path).read(), opts)
        if ptx is None:
            print(f"{name:<20} FAIL: NVRTC\n{log[-3000:]}")
            failed = True
            continue
        ptx_path = os.path.join(a.out, name + ".ptx")
        open(ptx_path, "w").write(ptx)
        try:
            kernels = assemble(ptxas, ptx_path, arch)
        except RuntimeError as e:
            print(f"{name:<20} FAIL: ptxas\n{e}")
            failed = True
            continue
        notes = []
        spilled = [k for k, v in kernels.items() if v["spill_st"] or v["spill_ld"]]
        if spilled:
            notes.append("spills in " + ", ".join(f"{k} ({kernels[k]['spill_st']}/{kernels[k]['spill_ld']} B)" for k in spilled))
        shared_path = os.path.join(a.out, name + ".shared")
        if os.path.exists(shared_path):
            for line in open(shared_path).read().splitlines():
                kernel, dynamic = line.split()
                static = kernels.get(kernel, {}).get("smem")
                if static is None:
                    notes.append(f"FAIL: {kernel} is not in the program")
                    failed = True
                    continue
                total = static + int(dynamic)
                fits = total <= OPTIN_SM90
                failed |= not fits
                verdict = "fits" if fits else "FAIL: over"
                notes.append(f"{kernel}: {static} static + {dynamic} dynamic = {total} B, {verdict} {OPTIN_SM90}")
        if a.show:
            for k, v in sorted(kernels.items()):
                if re.search(a.show, k):
                    print(f"    {name}: {k}: {v['regs']} registers, {v['smem']} B static shared, spills {v['spill_st']}/{v['spill_ld']} B")
        regs = max((v["regs"] for v in kernels.values()), default=0)
        smem = max((v["smem"] for v in kernels.values()), default=0)
        print(f"{name:<20} {len(kernels):>7} {regs:>8} {smem:>15}  {'; '.join(notes) or '-'}", flush=True)
    print("nvrtc-check: " + ("FAILURES above" if failed else f"every program compiles and assembles for {a.arch}"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
