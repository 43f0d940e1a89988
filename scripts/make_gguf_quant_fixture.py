#!/usr/bin/env python3
"""The dequantizers' reference data (tests/unit/fixtures/gguf/quants.gguf): for every tensor type
vlm reads, random blocks and what the PyPI `gguf` package's own dequantizer
(gguf.quants.dequantize, llama.cpp's gguf-py) makes of them, written as one GGUF file by the
package's writer: tensor `q.TYPE` holds the blocks as stored, `f.TYPE` (F32, same shape) the
package's values.

The blocks are random bytes, as a quantizer's output looks to a decoder, except the f16 scales
(d, dmin, m), which are random finite halves from about 1e-7 (subnormal) to 1e2, so that every
value is finite and the comparison is of bits. The plain types (F16, BF16) hold random finite
values. Rows of 256 (K-quants) or 64 elements, 12 rows a type: enough blocks that every scale,
sign and bit position occurs.

Usage (a virtualenv with `gguf` and numpy: scripts/requirements-gguf.txt):
    python scripts/make_gguf_quant_fixture.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

OUT = Path(__file__).resolve().parent.parent / "tests" / "unit" / "fixtures" / "gguf" / "quants.gguf"

# Byte offsets of each block's f16 scales.
HALVES = {
    Q.Q4_0: [0],
    Q.Q4_1: [0, 2],
    Q.Q5_0: [0],
    Q.Q5_1: [0, 2],
    Q.Q8_0: [0],
    Q.Q2_K: [80, 82],
    Q.Q3_K: [108],
    Q.Q4_K: [0, 2],
    Q.Q5_K: [0, 2],
    Q.Q6_K: [208],
    Q.IQ4_NL: [0],
    Q.IQ4_XS: [0],
}
ROWS = 12


def random_halves(rng: np.random.Generator, n: int) -> np.ndarray:
    mag = np.exp(rng.uniform(np.log(1e-7), np.log(1e2), n))
    sign = rng.choice([-1.0, 1.0], n)
    return (mag * sign).astype(np.float16)


def main() -> int:
    rng = np.random.default_rng(6464)
    w = gguf.GGUFWriter(str(OUT), arch="vlmtest")
    for qtype in [Q.F16, Q.BF16, *HALVES]:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        row = 256 if block == 256 else 64
        if qtype in (Q.F16, Q.BF16):
            values = (rng.standard_normal((ROWS, row)) * np.exp(rng.uniform(-8, 8, (ROWS, 1))))
            values = values.astype(np.float32)
            raw = gguf.quants.quantize(values, qtype)  # F16: astype; BF16: round to nearest even
        else:
            n_blocks = ROWS * row // block
            raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
            for off in HALVES[qtype]:
                raw[:, off:off + 2] = random_halves(rng, n_blocks).view(np.uint8).reshape(-1, 2)
            raw = raw.reshape(ROWS, row // block * size)
        ref = gguf.quants.dequantize(raw, qtype).astype(np.float32)
        assert ref.shape == (ROWS, row) and np.isfinite(ref).all(), qtype.name
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(ROWS, -1)  # the byte shape
        w.add_tensor(f"q.{qtype.name}", raw, raw_dtype=qtype)
        w.add_tensor(f"f.{qtype.name}", ref)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
