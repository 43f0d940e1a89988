#!/usr/bin/env python3
"""Squared error of INT4 group scales (32 weights per group, q in -8..7), for the choice in
src/ops/quantize.cc (kInt4Divisors).

    python3 scripts/int4_scale_candidates.py      # numpy only, a few seconds

Rows: N(0, 0.02^2) rounded to bfloat16 (the values of scripts/make_random_checkpoint.py, so of
CKPT_DIR), and Laplace and Student-t(3) rows, whose heavier tails are closer to trained
weights. Each candidate set picks, per group, the scale whose q = clamp(round_half_even(w / s))
gives the smallest sum (w - q s)^2. A divisor d > 0 means s = max|w| / d; d < 0 means
s = -w_max / |d| with w_max the largest-|w| weight with its sign (it lands on q = -8, as in
ggml's Q4_0).
"""

import numpy as np

SETS = {
    "max|w|/7": [7],
    "Q4_0: -w_max/8": [-8],
    "{7, -8, -8.5} (vlm)": [7, -8, -8.5],
    "{7, 7.5, -8, -8.5}": [7, 7.5, -8, -8.5],
    "18: +-7..9 step 0.25": [s * (7 + 0.25 * i) for s in (1, -1) for i in range(9)],
}


def bf16(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def group_sse(g, s):
    safe = np.where(s == 0, 1, s)
    q = np.clip(np.round(g / safe), -8, 7)  # numpy rounds half to even
    return ((g - q * s) ** 2).sum(axis=1)


def report(name, w):
    g = w.reshape(-1, 32).astype(np.float64)
    total = (g**2).sum()
    amax = np.abs(g).max(axis=1, keepdims=True)
    wmax = g[np.arange(len(g)), np.abs(g).argmax(axis=1)][:, None]
    base = None
    print(f"{name}: {len(g)} groups")
    for label, divisors in SETS.items():
        best = np.full(len(g), np.inf)
        for d in divisors:
            best = np.minimum(best, group_sse(g, amax / d if d > 0 else -wmax / -d))
        sse = best.sum()
        base = base or sse
        print(f"  {label:24s} rms error / rms w {np.sqrt(sse / total):.4f}"
              f"   squared error vs max|w|/7 {sse / base:.3f}")


def main():
    rng = np.random.default_rng(0)
    shape = (512, 2048)
    report("N(0, 0.02^2) as bf16", bf16(rng.normal(0, 0.02, shape)))
    report("Laplace", rng.laplace(size=shape))
    report("Student-t(3)", rng.standard_t(3, size=shape))


if __name__ == "__main__":
    main()
