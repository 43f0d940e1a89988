#!/usr/bin/env python3
"""Writes a Qwen3-VL checkpoint (transformers' config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, preprocessor_config.json) as GGUF, laid out as llama.cpp's
convert_hf_to_gguf.py lays it out: OUT.gguf (architecture qwen3vl: the text model, its
tokenizer and chat template) and OUT-mmproj.gguf (the vision tower, projector qwen3vl_merger:
the Conv3D patch embedding split into its two frames, the DeepStack mergers numbered by the
vision layer they tap). Written with the PyPI `gguf` package (llama.cpp's gguf-py), without torch,
so that CI can make the files itself; tests/gguf/demo_gguf_test.py checks that they hold what the
converter's do, tensor for tensor, on a checkpoint both wrote.

Types: --type f32 (every tensor F32), or q8_0 (the 2-D and larger weights whose rows are a
multiple of 32 in Q8_0, by the package's quantizer, bit-exact with ggml's; the rest F32).

Usage (a Python with `gguf` and numpy: scripts/requirements-test.txt):
    python scripts/write_gguf.py CKPT_DIR OUT [--type f32|q8_0] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, TokenType


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """An F32 model.safetensors as numpy arrays (what the tiny checkpoints hold)."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {info['dtype']}; this writer takes F32 checkpoints")
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data, np.float32, (end - begin) // 4,
                                  8 + n + begin).reshape(info["shape"])
    return out


def add(w: gguf.GGUFWriter, name: str, x: np.ndarray, qtype: str) -> None:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == "q8_0" and x.ndim >= 2 and x.shape[-1] % 32 == 0:
        w.add_tensor(name, gguf.quants.quantize(x, Q.Q8_0), raw_dtype=Q.Q8_0)
    else:
        w.add_tensor(name, x)


TEXT_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
VISION_BLOCK = {
    "attn.qkv": "attn_qkv", "attn.proj": "attn_out", "norm1": "ln1", "norm2": "ln2",
    "mlp.linear_fc1": "ffn_up", "mlp.linear_fc2": "ffn_down",
}


def add_tokenizer(w: gguf.GGUFWriter, tok_dir: Path, vocab_size: int, config: dict) -> None:
    """tokenizer.ggml.* as the converter writes a Qwen tokenizer (gpt2 model, qwen2 split):
    every id below vocab_size, [PAD<id>] (unused) where the tokenizer has none; added tokens
    control tokens when special or shaped <|...|>, else user-defined."""
    tok = json.loads((tok_dir / "tokenizer.json").read_text())
    tc = json.loads((tok_dir / "tokenizer_config.json").read_text())
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a for a in tok["added_tokens"]}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in added:
            a = added[i]
            c = a["content"]
            looks = c.startswith("<|") and c.endswith("|>")
            tokens.append(c)
            types.append(TokenType.CONTROL if a["special"] or looks else TokenType.USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)

    def token_of(key):
        v = tc.get(key)
        return v.get("content") if isinstance(v, dict) else v

    if (eos := token_of("eos_token")) in ids:
        w.add_eos_token_id(ids[eos])
    if (pad := token_of("pad_token")) in ids:
        w.add_pad_token_id(ids[pad])
    if (bos := config["text_config"].get("bos_token_id")) is not None:
        w.add_bos_token_id(bos)
    w.add_add_bos_token(bool(tc.get("add_bos_token", False)))
    if "chat_template" in tc:
        w.add_chat_template(tc["chat_template"])


def write_text(ckpt: Path, tok_dir: Path, out: Path, qtype: str) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    t = config["text_config"]
    tensors = read_safetensors(ckpt / "model.safetensors")
    arch = "qwen3vl"
    w = gguf.GGUFWriter(str(out), arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_block_count(t["num_hidden_layers"])
    w.add_context_length(t["max_position_embeddings"])
    w.add_embedding_length(t["hidden_size"])
    w.add_feed_forward_length(t["intermediate_size"])
    w.add_head_count(t["num_attention_heads"])
    w.add_head_count_kv(t["num_key_value_heads"])
    rope = t.get("rope_scaling") or {}
    w.add_rope_dimension_sections(list(rope["mrope_section"]) + [0])
    w.add_rope_freq_base(t["rope_theta"])
    w.add_layer_norm_rms_eps(t["rms_norm_eps"])
    w.add_key_length(t["head_dim"])
    w.add_value_length(t["head_dim"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "q8_0" else gguf.LlamaFileType.ALL_F32)
    w.add_uint32(f"{arch}.n_deepstack_layers",
                 len(config["vision_config"].get("deepstack_visual_indexes", [])))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer(w, tok_dir, t["vocab_size"], config)
    p = "model.language_model."
    add(w, "token_embd.weight", tensors[p + "embed_tokens.weight"], qtype)
    for l in range(t["num_hidden_layers"]):
        for hf, g in TEXT_LAYER.items():
            add(w, f"blk.{l}.{g}", tensors[f"{p}layers.{l}.{hf}"], qtype)
    add(w, "output_norm.weight", tensors[p + "norm.weight"], qtype)
    if not config.get("tie_word_embeddings", False) and "lm_head.weight" in tensors:
        add(w, "output.weight", tensors["lm_head.weight"], qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_vision(ckpt: Path, out: Path, qtype: str) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    v = config["vision_config"]
    t = config["text_config"]
    pp_file = ckpt / "preprocessor_config.json"
    pp = json.loads(pp_file.read_text()) if pp_file.exists() else {}
    tensors = read_safetensors(ckpt / "model.safetensors")
    w = gguf.GGUFWriter(str(out), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "q8_0" else gguf.LlamaFileType.ALL_F32)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_uint32("clip.vision.projection_dim", v["out_hidden_size"])
    w.add_uint32("clip.vision.image_size", int(v["num_position_embeddings"] ** 0.5 * v["patch_size"]))
    w.add_uint32("clip.vision.patch_size", v["patch_size"])
    w.add_uint32("clip.vision.embedding_length", v["hidden_size"])
    w.add_uint32("clip.vision.feed_forward_length", v["intermediate_size"])
    w.add_uint32("clip.vision.block_count", v["depth"])
    w.add_uint32("clip.vision.attention.head_count", v["num_heads"])
    w.add_array("clip.vision.image_mean", pp.get("image_mean", [0.5, 0.5, 0.5]))  # Qwen's default
    w.add_array("clip.vision.image_std", pp.get("image_std", [0.5, 0.5, 0.5]))
    w.add_string("clip.projector_type", "qwen3vl_merger")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.spatial_merge_size", v["spatial_merge_size"])
    w.add_float32("clip.vision.attention.layer_norm_epsilon", t.get("rms_norm_eps", 1e-6))
    deepstack = v.get("deepstack_visual_indexes", [])
    w.add_array("clip.vision.is_deepstack_layers", [l in deepstack for l in range(v["depth"])])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    p = "model.visual."
    conv = tensors[p + "patch_embed.proj.weight"]  # [h, C, 2, P, P]
    add(w, "v.patch_embd.weight", conv[:, :, 0], qtype)
    add(w, "v.patch_embd.weight.1", conv[:, :, 1], qtype)
    add(w, "v.patch_embd.bias", tensors[p + "patch_embed.proj.bias"], qtype)
    add(w, "v.position_embd.weight", tensors[p + "pos_embed.weight"], qtype)
    for l in range(v["depth"]):
        for hf, g in VISION_BLOCK.items():
            for kind in ("weight", "bias"):
                add(w, f"v.blk.{l}.{g}.{kind}", tensors[f"{p}blocks.{l}.{hf}.{kind}"], qtype)
    for k, layer in enumerate(deepstack):
        for hf, g in (("norm", "norm"), ("linear_fc1", "fc1"), ("linear_fc2", "fc2")):
            for kind in ("weight", "bias"):
                add(w, f"v.deepstack.{layer}.{g}.{kind}",
                    tensors[f"{p}deepstack_merger_list.{k}.{hf}.{kind}"], qtype)
    for hf, g in (("linear_fc1", "mm.0"), ("linear_fc2", "mm.2"), ("norm", "v.post_ln")):
        for kind in ("weight", "bias"):
            add(w, f"{g}.{kind}", tensors[f"{p}merger.{hf}.{kind}"], qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("out", help="OUT: writes OUT.gguf and OUT-mmproj.gguf")
    ap.add_argument("--type", choices=["f32", "q8_0"], default="f32")
    ap.add_argument("--tokenizer", type=Path, help="tokenizer.json's folder (default: CKPT)")
    a = ap.parse_args()
    write_text(a.ckpt, a.tokenizer or a.ckpt, Path(a.out + ".gguf"), a.type)
    write_vision(a.ckpt, Path(a.out + "-mmproj.gguf"), a.type)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
