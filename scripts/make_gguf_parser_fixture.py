#!/usr/bin/env python3
"""The GGUF parser's reference file (tests/unit/fixtures/gguf/reference.gguf), written by the PyPI
`gguf` package's own writer (GGUFWriter, llama.cpp's gguf-py), and what it holds
(reference.json): a value of every metadata type (each integer type at its extremes, floats,
bools, a string with UTF-8 and a NUL byte, arrays of integers, floats, bools, strings and arrays
of arrays), `general.alignment` 64, and small tensors of the plain and quantized types (their
bytes random, as a quantizer's output looks to a parser): F32 [3, 5], F16 and BF16 [32], Q8_0
[64, 2], Q4_K [256], Q6_K [256, 2] and IQ4_NL [32, 3], shapes in ggml's order (ne[0] first).
reference.json gives each tensor as the package's reader (GGUFReader) finds it: type, shape,
offset in the data section, byte count and the SHA-256 of its bytes; and every tensor type the
package knows, with its number, block elements and block bytes.

Usage (a virtualenv with `gguf` and numpy: scripts/requirements-gguf.txt):
    python scripts/make_gguf_parser_fixture.py
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGUFValueType as V

OUT = Path(__file__).resolve().parent.parent / "tests" / "unit" / "fixtures" / "gguf"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "reference.gguf"
    w = gguf.GGUFWriter(str(path), arch="vlmtest")
    meta = {}

    def kv(key, val, vtype, sub=None, record=None):
        w.add_key_value(key, val, vtype, sub)
        meta[key] = {"type": vtype.name, "value": record if record is not None else val}

    kv("t.u8", 255, V.UINT8)
    kv("t.i8", -128, V.INT8)
    kv("t.u16", 65535, V.UINT16)
    kv("t.i16", -32768, V.INT16)
    kv("t.u32", 4294967295, V.UINT32)
    kv("t.i32", -2147483648, V.INT32)
    kv("t.u64", 18446744073709551615, V.UINT64)
    kv("t.i64", -9223372036854775808, V.INT64)
    kv("t.f32", 0.1, V.FLOAT32, record=float(np.float32(0.1)))
    kv("t.f64", -2.5e-300, V.FLOAT64)
    kv("t.true", True, V.BOOL)
    kv("t.false", False, V.BOOL)
    kv("t.str", "héllo\u0000wörld ✓", V.STRING)
    kv("t.empty", "", V.STRING)
    kv("t.ints", [1, -2, 3, -4], V.ARRAY, V.INT32)
    kv("t.floats", [0.5, -1.25], V.ARRAY, V.FLOAT32)
    kv("t.bools", [True, False, True], V.ARRAY, V.BOOL)
    kv("t.strs", ["a", "", "Ġworld", "<|im_end|>"], V.ARRAY, V.STRING)
    kv("t.nested", [[1, 2], [3]], V.ARRAY, V.ARRAY)
    w.add_custom_alignment(64)  # general.alignment, and the writer pads to it
    meta["general.alignment"] = {"type": "UINT32", "value": 64}

    rng = np.random.default_rng(20261205)
    tensors = []

    def add(name, ggml_shape, qtype, block, block_bytes, dtype=None):
        numel = int(np.prod(ggml_shape))
        if dtype is not None:  # a plain type: numpy values, shape outermost first
            arr = rng.standard_normal(numel).astype(dtype).reshape(tuple(reversed(ggml_shape)))
            w.add_tensor(name, arr, raw_dtype=qtype)
        else:  # any other type: its bytes, [rows, bytes of a row] (the writer's byte shape)
            raw = rng.integers(0, 256, numel // block * block_bytes, dtype=np.uint8)
            w.add_tensor(name, raw.reshape(numel // ggml_shape[0], -1), raw_dtype=qtype)

    add("f32", [3, 5], Q.F32, 1, 4, np.float32)
    add("f16", [32], Q.F16, 1, 2, np.float16)
    add("bf16", [32], Q.BF16, 1, 2, None)
    add("q8_0", [64, 2], Q.Q8_0, 32, 34)
    add("q4_k", [256], Q.Q4_K, 256, 144)
    add("q6_k", [256, 2], Q.Q6_K, 256, 210)
    add("iq4_nl", [32, 3], Q.IQ4_NL, 32, 18)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # What the package's own reader finds: each tensor's type, ggml shape, offset and bytes.
    r = gguf.GGUFReader(str(path))
    for t in r.tensors:
        raw = bytes(np.asarray(t.data).tobytes())
        tensors.append({"name": t.name, "type": t.tensor_type.name,
                        "shape": [int(d) for d in t.shape], "offset": int(t.data_offset - r.data_offset),
                        "nbytes": int(t.n_bytes), "sha256": hashlib.sha256(raw).hexdigest()})
        assert len(raw) == t.n_bytes
    ref = {"generator": {"gguf": __import__("importlib.metadata").metadata.version("gguf")},
           "version": 3, "alignment": 64, "data_offset": int(r.data_offset),
           "metadata": meta, "tensors": tensors,
           "types": {q.name: [q.value, b, n] for q, (b, n) in gguf.GGML_QUANT_SIZES.items()}}
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
