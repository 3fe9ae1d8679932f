#!/usr/bin/env python3
"""Compiles the one-kernel decoding step as the CUDA backend does (NVRTC, the same sources and
defines) and reports ptxas's registers, spills and stack for it, on a machine without a GPU:
NVRTC and ptxas come from pip's nvidia-cuda-nvrtc-cu12 and nvidia-cuda-nvcc-cu12 wheels, in the
virtual environment scripts/nvrtc-check.py sets up. A measurement aid for versions of the kernel
(scripts/nvrtc-check.py checks the runtime's own builds): the device's NVRTC may be newer.

    python3 scripts/decoder-ptxas.py [decoder.cu ...] [-D NAME=VALUE ...] [--shape 512,8,1368] [--venv DIR]
"""
import argparse, ctypes, importlib.util, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K = os.path.join(ROOT, "runtime", "backend", "kernels")
# NVRTC, ptxas and the compile call are scripts/nvrtc-check.py's.
_spec = importlib.util.spec_from_file_location("nvrtc_check", os.path.join(ROOT, "scripts", "nvrtc-check.py"))
nvrtc_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nvrtc_check)


def nvrtc_ptx(src, opts, lib):
    ptx, log = nvrtc_check.nvrtc_compile(lib, "decoder", src, opts)
    if ptx is None:
        sys.exit(f"nvrtc failed:\n{log}")
    return ptx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sources", nargs="*", default=[os.path.join(K, "decoder.cu")])
    ap.add_argument("-D", action="append", default=[])
    ap.add_argument("--shape", default="512,8,1368")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--keep", help="a folder to keep each source's cubin in (for cuobjdump -sass)")
    ap.add_argument("--venv", default=os.path.join(ROOT, "target", "nvrtc-venv"), help="NVRTC and ptxas's pip wheels (see nvrtc-check.py)")
    a = ap.parse_args()
    libpath, ptxas = nvrtc_check.setup(a.venv)
    lib = ctypes.CDLL(libpath)
    d, h, hid = a.shape.split(",")
    # The runtime's default buffers (cuda_decoder.rs, Knobs): 112 KiB of weights, 64 of activations.
    defs = {"FD_D": d, "FD_HEADS": h, "FD_HID": hid, "FD_WBUF_BYTES": "114688", "FD_ABUF_BYTES": "65536", "FD_NT": "2", "FD_MT": "4"}
    for kv in a.D:
        k, _, v = kv.partition("=")
        defs[k] = v
    prelude = "".join(open(os.path.join(K, f)).read() + "\n" for f in ("core.cu", "ops.cu", "half.cu"))
    for path in a.sources:
        opts = [f"--gpu-architecture=compute_{a.arch[3:]}", "-std=c++17"] + [f"-D{k}={v}" for k, v in defs.items()]
        ptx = nvrtc_ptx(prelude + open(path).read(), opts, lib)
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ptx)
        cubin = f.name[:-4] + ".cubin"
        out = subprocess.run([ptxas, "-v", f"-arch={a.arch}", f.name, "-o", cubin], capture_output=True, text=True)
        os.unlink(f.name)
        # The machine code's size, function by function (the cubin's .text sections).
        text = subprocess.run(["readelf", "-SW", cubin], capture_output=True, text=True).stdout if os.path.exists(cubin) else ""
        sizes = {}
        for l in text.splitlines():
            parts = l.replace("[ ", "[").split()
            if len(parts) > 6 and parts[1].startswith(".text.") and ("fd_" in parts[1] or "decoder_step" in parts[1]):
                sizes[parts[1][6:]] = int(parts[5], 16)
        if os.path.exists(cubin):
            if a.keep:
                os.makedirs(a.keep, exist_ok=True)
                os.replace(cubin, os.path.join(a.keep, os.path.basename(path)[:-3] + ".cubin"))
            else:
                os.unlink(cubin)
        print(f"== {path}")
        lines = (out.stdout + out.stderr).splitlines()
        # ptxas reports a function's properties, then (for a kernel) its registers: keep the
        # decoder's kernel and its out-of-line functions (fd_*), and any error.
        for i, line in enumerate(lines):
            if "error" in line:
                print("  " + line.strip())
            if "Function properties for" in line and ("fd_" in line or "decoder_step" in line):
                name = line.split("for", 1)[1].strip()
                rest = [l.split("info    :")[-1].strip() for l in lines[i + 1:i + 3] if "Function properties" not in l and "Compiling" not in l]
                print(f"  {name[:90]}: " + "; ".join(rest) + (f"; {sizes[name]} bytes of code" if name in sizes else ""))
        print(f"  all of it: {sum(sizes.values())} bytes of code")


main()
