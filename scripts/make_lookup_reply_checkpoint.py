#!/usr/bin/env python3
"""A checkpoint whose greedy reply repeats a passage of its prompt: prompt lookup's benchmark.

    python3 scripts/make_random_checkpoint.py --shape 2b --out BASE_DIR
    python3 scripts/make_lookup_reply_checkpoint.py --base BASE_DIR --out CKPT_DIR \\
        --vlm build/tools/cli/vlm

Built like tests/model/fixtures/forced-reply (scripts/make_forced_reply_fixture.py), from any
dense Qwen3-VL or Qwen3.5 checkpoint in BF16 (the random 2B shapes: their products cost what the
real models' do): every decoder layer's output projections (self_attn.o_proj,
linear_attn.out_proj, mlp.down_proj) are zero, so the final hidden state is the RMS-normalised
embedding of the current token (the final norm scaling by one); the head is untied, zero but for the successors of a chain "\\n" → w1 → w2 → … → wN →
<|im_end|>, where lm_head[succ(t)] = SCALE · rms_norm(embed[t]). The words w1 … wN are distinct
common English words, each one token with its leading space, so the text "Repeat after me:
w1 w2 … wN\\n" tokenizes to the chain; its greedy reply is " w1 w2 … wN" — the passage of the
prompt, which prompt lookup (vlm's --spec ngram, llama.cpp's llama-lookup) can propose from the
second token on. The prompt is written to CKPT_DIR/lookup_prompt.txt.

A Qwen3.5 base's MTP head (mtp.*, speculative decoding's --spec mtp) is made to propose the same
chain: fc takes the next token's embedding alone ([I | 0]), its layer's output projections are
zero and its norms scale by one, so its output is the RMS-normalised embedding of the token it is
given and the head maps it to that token's successor — the token after next, as an MTP head
predicts; every proposal is right, while each still costs the head's full layer.

The script tokenizes with `vlm tokenize` (--vlm) and checks, in numpy, that every chain token's
argmax is its successor with a wide margin. Needs numpy only. The checkpoint is the base's size
plus the untied head (2B shape: 4.9 GB); it is a benchmark input, not a fixture.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np

from make_forced_reply_fixture import from_bf16, to_bf16

SCALE = 0.01  # the successor's logit is SCALE · hidden (20 at hidden 2048); others near 0
NEWLINE = 198
IM_END = 151645

WORDS = """time year people way day man thing woman life child world school state family student
group country problem hand part place case week company system program question work government
number night point home water room mother area money story fact month lot right study book eye
job word business issue side kind head house service friend father power hour game line end
member law car city community name president team minute idea kid body information back parent
face others level office door health person art war history party result change morning reason
research girl guy moment air teacher force education foot boy age policy music market sense
nation plan college interest death experience effect class control care field development role
effort rate heart drug show leader light voice wife police mind price report decision son view
relationship town road arm difference value building action model season society tax director
position player record paper space ground form event official matter center couple site project
activity star table need court oil situation cost industry figure street image phone data picture
practice piece land product doctor wall patient worker news test movie north love support
technology step baby computer type attention film tree source organization hair window evidence
population site hospital church""".split()


def read_header(path: Path):
    with path.open("rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return header, 8 + n


def load_tensors(base: Path):
    """name -> (dtype, shape, memmap of its bytes)."""
    out = {}
    for shard in sorted(base.glob("*.safetensors")):
        header, start = read_header(shard)
        mm = np.memmap(shard, dtype=np.uint8, mode="r")
        for k, v in header.items():
            if k == "__metadata__":
                continue
            b, e = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], mm[start + b:start + e])
    return out


def rms_norm(x, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def tokenize(vlm: str, model: Path, text: str):
    out = subprocess.run([vlm, "tokenize", "-m", str(model), "--text", text], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def write_safetensors(path: Path, tensors):
    """tensors: name -> (dtype, shape, bytes-like), in name order."""
    header, off = {}, 0
    for k in sorted(tensors):
        dt, shape, data = tensors[k]
        n = np.asarray(data).nbytes
        header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for k in sorted(tensors):
            f.write(memoryview(np.ascontiguousarray(tensors[k][2])).cast("B"))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="a dense Qwen3-VL checkpoint, BF16")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vlm", default="build/tools/cli/vlm", help="the vlm binary (tokenize)")
    ap.add_argument("--words", type=int, default=200, help="the passage's length at most")
    args = ap.parse_args()

    # The passage: words that are one token each with their leading space, all different.
    chain_words, ids = [], []
    for w in WORDS:
        t = tokenize(args.vlm, args.base, " " + w)
        if len(t) == 1 and t[0] not in ids and t[0] not in (NEWLINE, IM_END):
            chain_words.append(w)
            ids.append(t[0])
        if len(ids) == args.words:
            break
    prompt = "Repeat after me:" + "".join(" " + w for w in chain_words) + "\n"
    got = tokenize(args.vlm, args.base, prompt)
    assert got[-len(ids) - 1:] == ids + [NEWLINE], "the passage does not tokenize word by word"
    chain = [NEWLINE] + ids + [IM_END]
    succ = {chain[i]: chain[i + 1] for i in range(len(chain) - 1)}
    print(f"passage of {len(ids)} words, prompt of {len(got)} tokens")

    t = load_tensors(args.base)
    p = "model.language_model."
    dt, (vocab, hidden), raw = t[p + "embed_tokens.weight"]
    assert dt == "BF16"
    embed = raw.view(np.uint16).reshape(vocab, hidden)
    rows = np.array(list(succ.keys()))
    normed = rms_norm(from_bf16(embed[rows]))
    succ_rows = np.array([succ[int(r)] for r in rows])
    head = np.zeros((vocab, hidden), dtype=np.uint16)
    head[succ_rows] = to_bf16(SCALE * normed)
    # Each chain token's logits over the successors' rows (every other row is zero).
    logits = normed @ from_bf16(head[succ_rows]).T  # [chain, chain]
    top = np.argmax(logits, axis=1)
    assert (top == np.arange(len(rows))).all(), "a chain token's argmax is not its successor"
    srt = np.sort(logits, axis=1)
    margin = float(np.min(srt[:, -1] - np.maximum(srt[:, -2], 0)))
    print(f"smallest top-1 margin {margin:.2f} (successor logit {SCALE * hidden:.1f})")
    assert margin > 0.5 * SCALE * hidden

    cfg = json.loads((args.base / "config.json").read_text())
    qwen35 = cfg.get("model_type") == "qwen3_5"  # its norms scale by 1 + w
    assert not any(".experts." in k for k in t), "a dense checkpoint"
    out = dict(t)
    zero = lambda k: (t[k][0], t[k][1], np.zeros(len(t[k][2]), dtype=np.uint8))  # noqa: E731
    unit = lambda: ("BF16", [hidden],  # noqa: E731
                    to_bf16(np.full(hidden, 0.0 if qwen35 else 1.0, dtype=np.float32)))
    outputs = ("self_attn.o_proj.weight", "linear_attn.out_proj.weight", "mlp.down_proj.weight")
    for k in list(out):
        if k.startswith((p + "layers.", "mtp.layers.")) and k.endswith(outputs):
            out[k] = zero(k)
    out[p + "norm.weight"] = unit()
    out["lm_head.weight"] = ("BF16", [vocab, hidden], head)
    if "mtp.fc.weight" in t:  # the MTP head: [embedding | hidden] -> the embedding
        fc = np.zeros((hidden, 2 * hidden), dtype=np.float32)
        fc[:, :hidden] = np.eye(hidden, dtype=np.float32)
        out["mtp.fc.weight"] = ("BF16", [hidden, 2 * hidden], to_bf16(fc))
        out["mtp.pre_fc_norm_embedding.weight"] = unit()
        out["mtp.norm.weight"] = unit()
        print("MTP head: proposes the successor of the token it is given")

    args.out.mkdir(parents=True, exist_ok=True)
    cfg["tie_word_embeddings"] = False
    cfg["text_config"]["tie_word_embeddings"] = False
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in args.base.iterdir():
        if f.name != "config.json" and not f.name.startswith("model") and f.is_file():
            shutil.copy(f, args.out / f.name)
    write_safetensors(args.out / "model.safetensors", out)
    (args.out / "lookup_prompt.txt").write_text(prompt)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
