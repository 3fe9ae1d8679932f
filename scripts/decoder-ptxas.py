#!/usr/bin/env python3
"""Compiles the one-kernel decoding step as the CUDA backend does (NVRTC, the same sources and
defines) and reports ptxas's registers, spills and stack for it, on a machine without a GPU:
NVRTC and ptxas come from pip's nvidia-cuda-nvrtc-cu12 and nvidia-cuda-nvcc-cu12 wheels (unpacked
into CUDA_PIP, default /tmp/cuda). A measurement aid, not the build: the device's NVRTC may be
newer.

    python3 scripts/decoder-ptxas.py [decoder.cu ...] [-D NAME=VALUE ...] [--shape 512,8,1368]
"""
import argparse, ctypes, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K = os.path.join(ROOT, "runtime", "backend", "kernels")


def nvrtc_ptx(src, opts, lib):
    nv = ctypes.CDLL(lib)
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"decoder.cu", 0, None, None) == 0
    args = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = nv.nvrtcCompileProgram(prog, len(opts), args)
    size = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(f"nvrtc failed ({rc}):\n{log.value.decode(errors='replace')}")
    nv.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sources", nargs="*", default=[os.path.join(K, "decoder.cu")])
    ap.add_argument("-D", action="append", default=[])
    ap.add_argument("--shape", default="512,8,1368")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--keep", help="a folder to keep each source's cubin in (for cuobjdump -sass)")
    a = ap.parse_args()
    base = os.environ.get("CUDA_PIP", "/tmp/cuda")
    lib = os.path.join(base, "nvidia/cuda_nvrtc/lib/libnvrtc.so.12")
    ptxas = os.path.join(base, "nvidia/cuda_nvcc/bin/ptxas")
    d, h, hid = a.shape.split(",")
    defs = {"FD_D": d, "FD_HEADS": h, "FD_HID": hid, "FD_WBUF_BYTES": "65536", "FD_ABUF_BYTES": "98304", "FD_NT": "2", "FD_MT": "4"}
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
