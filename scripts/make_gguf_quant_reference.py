#!/usr/bin/env python3
"""Quantized GGUF fixtures and their transformers references (tests/model/fixtures/gguf-quant).

Two tiny random Qwen3-VL checkpoints whose rows are 256 wide (so that the K-quants, in
super-blocks of 256, really apply): `dense` (hidden 256, 2 heads of 128, 1 KV head, MLP 256, one
decoder layer, vocabulary 448, untied head) and `moe` (the same attention, 4 experts of 256, top
2, tied head). Each is converted to GGUF by llama.cpp's own convert_hf_to_gguf.py (F32, and F16
and BF16 for `dense`) and quantized by its llama-quantize with --pure to every type vlm reads; `moe` to
Q4_K. The demo model's tokenizer (models/tiny-qwen3vl) goes with them, registered as
Qwen2's pre-tokenizer for the conversion (see make_gguf_model_fixtures.py).

The reference for each file is transformers' (4.57.1, float32, eager) forward of the model with
every weight replaced by what the PyPI `gguf` package's dequantizer makes of the file's tensor:
the logits of a 24-id prompt and the greedy continuation (24 tokens, EOS ignored) of a 12-id
one; and the SHA-256 of every tensor as the package dequantizes it. The vision tower is not
part of these files (its path is proven at F32 by the gguf fixtures, every type's decoding by
the dequantizer tests).

Usage (outside the repository: llama.cpp's checkout with llama-quantize built, and a virtualenv
with torch, transformers==4.57.1 and gguf, e.g. llama.cpp's
requirements/requirements-convert_hf_to_gguf.txt):
    python scripts/make_gguf_quant_reference.py --llama-cpp LLAMA_CPP_DIR \
        --quantize LLAMA_CPP_DIR/build/bin/llama-quantize
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import gguf
from transformers import (Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLMoeConfig,
                          Qwen3VLMoeForConditionalGeneration)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_gguf_model_fixtures import WRAPPER  # noqa: E402  (the converter, pre-tokenizer registered)
from write_gguf import TEXT_LAYER  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "model" / "fixtures" / "gguf-quant"
DEMO = ROOT / "models" / "tiny-qwen3vl"

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
         "IQ4_XS"]
MODELS = {
    "dense": dict(moe=False, tie=False, types=TYPES, plain=True, seed=8801),
    "moe": dict(moe=True, tie=True, types=["Q4_K"], plain=False, seed=8802),
}
# The demo tokenizer's ids.
IDS = dict(bos=408, eos=410, image=420, video=421, vision_start=417, vision_end=418)
VOCAB = 448


def make_model(spec: dict):
    text = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=128, hidden_act="silu",
                max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=5e6,
                attention_bias=False, attention_dropout=0.0,
                rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20],
                              "mrope_interleaved": True},
                tie_word_embeddings=spec["tie"], bos_token_id=IDS["bos"],
                eos_token_id=IDS["eos"], initializer_range=0.02)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                  temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                  num_position_embeddings=2304, deepstack_visual_indexes=[0],
                  out_hidden_size=256, initializer_range=0.02)
    cls_cfg, cls_model = Qwen3VLConfig, Qwen3VLForConditionalGeneration
    if spec["moe"]:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256,
                    decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
        cls_cfg, cls_model = Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration
    cfg = cls_cfg(text_config=text, vision_config=vision, image_token_id=IDS["image"],
                  video_token_id=IDS["video"], vision_start_token_id=IDS["vision_start"],
                  vision_end_token_id=IDS["vision_end"], tie_word_embeddings=spec["tie"])
    torch.manual_seed(spec["seed"])
    model = cls_model(cfg).eval()
    g = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(p.shape, generator=g)
            if name.split(".")[-1] == "weight" and "norm" in name.split(".")[-2]:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.02 * noise)
            else:
                p.copy_(0.15 * noise)
    return model


# GGUF text tensor names -> transformers' (the converter's renaming, undone): write_gguf.py's
# table the other way round, and the MoE router.
LAYER = {g: hf for hf, g in TEXT_LAYER.items()} | {"ffn_gate_inp.weight": "mlp.gate.weight"}


def dequantized_hashes(path: Path) -> dict[str, str]:
    """The SHA-256 of each tensor's f32 values as the gguf package dequantizes them (row-major,
    the file's element order), for the test that vlm's dequantizer makes the same bytes."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: hashlib.sha256(np.ascontiguousarray(
        gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).tobytes()).hexdigest()
        for t in reader.tensors}


def dequantized_state(path: Path) -> dict[str, torch.Tensor]:
    """The file's text tensors, as the gguf package dequantizes them, under transformers' names
    and layouts (the experts fused again as transformers 4.57.1 holds them)."""
    reader = gguf.GGUFReader(str(path))
    p = "model.language_model."
    raw = {t.name: torch.from_numpy(
        np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type)).astype(np.float32))
        for t in reader.tensors}
    state = {}
    experts: dict[int, dict[str, torch.Tensor]] = {}
    for name, w in raw.items():
        if name == "token_embd.weight":
            state[p + "embed_tokens.weight"] = w
        elif name == "output_norm.weight":
            state[p + "norm.weight"] = w
        elif name == "output.weight":
            state["lm_head.weight"] = w
        else:
            _, layer, rest = name.split(".", 2)
            if rest.endswith("_exps.weight"):
                experts.setdefault(int(layer), {})[rest] = w
            else:
                state[f"{p}layers.{layer}.{LAYER[rest]}"] = w
    for layer, e in experts.items():
        gate = e["ffn_gate_exps.weight"].transpose(1, 2)  # [E, H, I]
        up = e["ffn_up_exps.weight"].transpose(1, 2)
        q = f"{p}layers.{layer}.mlp.experts."
        state[q + "gate_up_proj"] = torch.cat([gate, up], dim=2).contiguous()
        state[q + "down_proj"] = e["ffn_down_exps.weight"].transpose(1, 2).contiguous()
    return state


@torch.no_grad()
def reference(model, state: dict, prompt: list[int], greedy_prompt: list[int]):
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    text_missing = [m for m in missing if "visual" not in m and m != "lm_head.weight"]
    assert not text_missing, text_missing
    logits = model(input_ids=torch.tensor([prompt])).logits[0].float().numpy()
    out = model.generate(input_ids=torch.tensor([greedy_prompt]), max_new_tokens=24,
                         do_sample=False, eos_token_id=None, pad_token_id=0,
                         min_new_tokens=24)[0, len(greedy_prompt):].tolist()
    return logits, out


def convert(llama: Path, src: Path, out: Path, outtype: str) -> None:
    subprocess.run([sys.executable, "-c", WRAPPER, str(llama), "qwen2", str(src), "--outfile",
                    str(out), "--outtype", outtype], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--quantize", required=True, type=Path, help="llama-quantize")
    args = ap.parse_args()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    rng = np.random.default_rng(8800)
    prompt = rng.integers(0, 408, 24).tolist()
    greedy_prompt = rng.integers(0, 408, 12).tolist()
    ref = {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
           "gguf": gguf.__version__ if hasattr(gguf, "__version__") else "see requirements",
           "prompt": prompt, "greedy_prompt": greedy_prompt, "files": []}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for name, spec in MODELS.items():
            model = make_model(spec)
            ckpt = tmp / name
            model.save_pretrained(ckpt, safe_serialization=True)
            for f in ["tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"]:
                shutil.copy(DEMO / f, ckpt / f)
            f32 = tmp / f"{name}-f32.gguf"
            convert(args.llama_cpp, ckpt, f32, "f32")
            files = []
            if spec["plain"]:
                for outtype in ["F16", "BF16"]:
                    convert(args.llama_cpp, ckpt, OUT / f"{name}-{outtype}.gguf", outtype.lower())
                    files.append((f"{name}-{outtype}.gguf", outtype))
            for qtype in spec["types"]:
                out = OUT / f"{name}-{qtype}.gguf"
                subprocess.run([str(args.quantize), "--pure", str(f32), str(out), qtype],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                files.append((out.name, qtype))
            for file, qtype in files:
                fresh = make_model(spec)  # the vision tower as random as the file's lacks it
                logits, greedy = reference(fresh, dequantized_state(OUT / file), prompt,
                                           greedy_prompt)
                npy = file.replace(".gguf", "_logits.npy")
                np.save(OUT / npy, logits)
                ref["files"].append({"file": file, "type": qtype, "model": name,
                                     "logits": npy, "greedy": greedy,
                                     "tensors": dequantized_hashes(OUT / file)})
                print(f"{file}: {(OUT / file).stat().st_size} bytes, greedy {greedy[:8]}...")
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
