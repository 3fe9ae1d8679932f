#!/usr/bin/env python3
"""Fits the polynomial of gr_normal_tail (runtime/backend/kernels/ops.cu), the 16-bit GELU
kernels' normal tail Q(|x|) = 1 - Φ(|x|) = t · 2^(p(t) - x² log2(e)/2), t = 1 / (1 + 0.4 |x|).

p is fitted to log2(Q / t) + x² log2(e)/2 over |x| <= 14 (where bf16's GELU of -x underflows):
least squares on Chebyshev nodes in t, reweighted towards the largest residuals (a near-minimax
fit), its coefficients rounded to f32 one at a time from the highest, the rest refitted after each
so that the rounding is compensated. Prints the coefficients, highest degree first, and the
relative error of Q in f64 over |x| <= 12.

    python3 scripts/fit-gelu.py      (needs numpy and mpmath: pip install numpy mpmath)
"""
import numpy as np
import mpmath as mp

mp.mp.dps = 40
C, DEG, XMAX, NODES = np.float32(0.4), 8, 14.0, 400
HALF_LOG2E = 1 / np.log(2) / 2


def target(t):
    """log2(Q / t) + x² log2(e)/2 at the |x| of each t."""
    out = []
    for tv in t:
        ax = (1 / mp.mpf(tv) - 1) / float(C)
        q = mp.erfc(ax / mp.sqrt(2)) / 2
        out.append(float(mp.log(q / tv, 2) + mp.mpf(HALF_LOG2E) * ax * ax))
    return np.array(out)


def main():
    tmin = 1 / (1 + float(C) * XMAX)
    k = np.arange(NODES)
    t = tmin + (1 - tmin) * (np.cos(np.pi * (k + 0.5) / NODES) + 1) / 2
    y = target(t)
    fixed = []
    for _ in range(DEG + 1):
        r = y - sum(c * t ** (DEG - i) for i, c in enumerate(fixed))
        v = np.vander(t, DEG + 1)[:, len(fixed):]
        w = np.ones(NODES)
        for _ in range(30):
            cf, *_ = np.linalg.lstsq(v * w[:, None], r * w, rcond=None)
            res = np.abs(v @ cf - r)
            w = w * (res / res.max() + 1e-3) ** 0.5
            w /= w.max()
        fixed.append(float(np.float32(cf[0])))
    xs = np.linspace(0, 12, 6001)
    q = np.array([float(mp.erfc(mp.mpf(float(x)) / mp.sqrt(2)) / 2) for x in xs])
    tt = 1 / (float(C) * xs + 1)
    fit = tt * np.exp2(np.polyval(fixed, tt) - HALF_LOG2E * xs * xs)
    print("coefficients (highest degree first):")
    print(", ".join("%.9ef" % c for c in fixed))
    print("relative error of Q over |x| <= 12: %.2e" % (np.abs(fit - q) / q).max())


if __name__ == "__main__":
    main()
