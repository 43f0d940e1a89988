#!/usr/bin/env python3
"""A checkpoint whose greedy reply is fixed: tests/model/fixtures/forced-reply.

Built from tests/model/fixtures/tiny-fullvocab-bf16 (same config and vision tower) so that every
chat reply, whatever the question, is

    <think>Weather needs a tool.</think><tool_call>{"name":"get_weather","arguments":{"city": "Oslo"}}</tool_call>

followed by <|im_end|>. The decoder layer's output projections (attention o_proj, MLP down_proj)
are zero, so the final hidden state is the RMS-normalised embedding of the current token; the
head (untied) maps each token of the chain "\\n" → <think> → Weather → … → </tool_call> →
<|im_end|> to its successor: lm_head[succ(t)] = s · norm(embed[t]). The chain's tokens are all
different (so the successor is a function), and "\\n" ends every generation prompt. Every other
embedding and head row is zero. The script checks each step's argmax and margin on the bf16
weights before writing. Needs numpy only:

    python3 scripts/make_forced_reply_fixture.py
"""

import json
import shutil
import struct
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "tests/model/fixtures/tiny-fullvocab-bf16"
DST = REPO / "tests/model/fixtures/forced-reply"
# The reply's token ids with the Qwen3 tokenizer (tests/data/tokenizer), from
# `vlm tokenize -m tests/data/tokenizer --text '<think>Weather needs a tool.</think><tool_call>'
# '{"name":"get_weather","arguments":{"city": "Oslo"}}</tool_call><|im_end|>'`.
REPLY = [151667, 28981, 3880, 264, 5392, 13, 151668, 151657, 4913, 606, 3252, 455, 69364, 2198,
         16370, 22317, 8926, 788, 330, 28867, 385, 30975, 151658, 151645]
NEWLINE = 198  # the last token of every generation prompt ("<|im_start|>assistant\n")
SCALE = 2.0


def read_safetensors(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        assert v["dtype"] == "BF16", k
        out[k] = np.frombuffer(data[b:e], dtype=np.uint16).reshape(v["shape"]).copy()
    return out


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        b = tensors[k].astype(np.uint16).tobytes()
        header[k] = {"dtype": "BF16", "shape": list(tensors[k].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def to_bf16(x):
    """f32 → bf16 bits, round to nearest even."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def from_bf16(u):
    return (u.astype(np.uint32) << 16).view(np.float32)


def rms_norm(x, eps=1e-6):
    return x / np.sqrt(np.mean(x * x) + eps)


def main():
    assert len(set(REPLY)) == len(REPLY) and NEWLINE not in REPLY
    t = read_safetensors(SRC / "model.safetensors")
    prefix = "model.language_model."
    vocab, hidden = t[prefix + "embed_tokens.weight"].shape
    chain = [NEWLINE] + REPLY
    succ = {chain[i]: chain[i + 1] for i in range(len(chain) - 1)}
    for seed in range(100):
        rng = np.random.default_rng(seed)
        embed = np.zeros((vocab, hidden), dtype=np.float32)
        for tok in succ:
            embed[tok] = rng.standard_normal(hidden)
        embed_b = to_bf16(embed)
        head = np.zeros((vocab, hidden), dtype=np.float32)
        for tok, nxt in succ.items():
            head[nxt] = SCALE * rms_norm(from_bf16(embed_b[tok]))
        head_b = to_bf16(head)
        hf = from_bf16(head_b)
        margin = np.inf
        for tok, nxt in succ.items():
            logits = hf @ rms_norm(from_bf16(embed_b[tok]))
            order = np.argsort(-logits)
            assert order[0] == nxt, (seed, tok)
            margin = min(margin, logits[order[0]] - logits[order[1]])
        if margin > 8 * SCALE:
            break
    else:
        raise SystemExit("no seed gave a wide enough margin")
    print(f"seed {seed}: smallest top-1 margin {margin:.2f}")
    t[prefix + "embed_tokens.weight"] = embed_b
    t["lm_head.weight"] = head_b
    zero = lambda a: np.zeros_like(a)  # noqa: E731
    t[prefix + "layers.0.self_attn.o_proj.weight"] = zero(t[prefix + "layers.0.self_attn.o_proj.weight"])
    t[prefix + "layers.0.mlp.down_proj.weight"] = zero(t[prefix + "layers.0.mlp.down_proj.weight"])
    t[prefix + "norm.weight"] = to_bf16(np.ones(hidden, dtype=np.float32))
    DST.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((SRC / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    cfg["text_config"]["tie_word_embeddings"] = False
    (DST / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    shutil.copy(SRC / "generation_config.json", DST / "generation_config.json")
    write_safetensors(DST / "model.safetensors", t)


if __name__ == "__main__":
    main()
