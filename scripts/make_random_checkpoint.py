#!/usr/bin/env python3
"""Write a random-weight Qwen3-VL or Qwen3.5 checkpoint with the real published shapes and layout.

    python3 scripts/make_random_checkpoint.py --out CKPT_DIR --shape 2b   # also 4b, 8b
    python3 scripts/make_random_checkpoint.py --out CKPT_DIR --shape 30b-a3b --layers 24
    python3 scripts/make_random_checkpoint.py --out CKPT_DIR --shape qwen3.5-9b --layers 8
    python3 scripts/make_random_checkpoint.py --out CKPT_DIR --shape 35b-a3b --layers 8
    python3 scripts/make_random_checkpoint.py --out CKPT_DIR --shape 8b --fp8
    python3 scripts/make_random_checkpoint.py --out CKPT_DIR --shape 8b --gptq 128 [--act-order]

--fp8 (the dense shapes) writes Qwen's published *-FP8 layout: every text-decoder projection as
F8_E4M3 (N(0, 64) rounded to E4M3) with an F32 `weight_scale_inv` per 128 x 128 block (some
published checkpoints store them in BF16; vlm reads either) (0.02 / 64
times 2^U(-1/2, 1/2): the weights are about N(0, 0.02) as in BF16), config.json's
quantization_config as Qwen writes it (quant_method fp8, fmt e4m3, activation_scheme dynamic,
weight_block_size [128, 128], modules_to_not_convert [lm_head, model.embed_tokens]); the vision
tower, embedding and norms stay BF16.

--gptq G (the dense shapes) writes GPTQModel's 4-bit GPTQ layout (checkpoint_format gptq, sym):
every text-decoder projection as qweight I32 [K/8, N] (uniform random codes), qzeros I32 [K/G, N/8]
(every zero point 8, stored minus one as v1 does), scales F16 [K/G, N] (0.02 / 4 times
2^U(-1/2, 1/2)), g_idx I32 [K] (k / G; with --act-order, desc_act's: the same groups over a random
order of the columns); lm_head, the vision tower, embedding and norms stay BF16.

The Qwen3.5 shapes (qwen3.5-2b, qwen3.5-9b: Qwen/Qwen3.5-2B and -9B as published, model_type
qwen3_5) write three Gated DeltaNet layers to each gated attention layer (linear_attn.in_proj_qkv,
in_proj_z, in_proj_b, in_proj_a, conv1d [conv_dim, 1, 4], A_log and the gated norm in F32 as the
checkpoints hold them, dt_bias, out_proj; self_attn.q_proj with a gate row per query row), a
vision tower without DeepStack, and the MTP head (mtp.*, which vlm does not read), and no
generation_config.json (the published repositories have none). Their parameter counts are the
published safetensors totals (2,274,069,824 and 9,653,104,368). Zero-centred norm weights (which
scale by 1 + w) are N(0, 0.02); --layers keeps the first L layers, a multiple of 4 keeping the
3:1 pattern. The Qwen3.5 mixture of experts (35b-a3b: Qwen/Qwen3.5-35B-A3B's config.json
values, model_type qwen3_5_moe) writes every layer's router, the fused experts in nn.Linear's
layout per expert (mlp.experts.gate_up_proj [E, 2 * moe_intermediate, hidden], gate rows then up
rows; mlp.experts.down_proj [E, hidden, moe_intermediate]), the shared expert and its gate
(mlp.shared_expert.*, mlp.shared_expert_gate.weight [1, hidden]); its MTP layer has the same
MLP. Its parameter count is the published total too (35,951,822,704); all 40 layers are about
72 GB in BF16, so cut them with --layers (4 layers, one of them full attention: 9.5 GB).

The mixture-of-experts shapes (30b-a3b, 235b-a22b: Qwen3-VL-30B-A3B / 235B-A22B-Instruct) write
the fused expert tensors as those checkpoints hold them (mlp.experts.gate_up_proj
[E, hidden, 2 * moe_intermediate], mlp.experts.down_proj [E, moe_intermediate, hidden], the
router mlp.gate.weight [E, hidden]). --layers keeps the first L decoder layers at full shape
(config.json says L): all 48 layers of 30B-A3B are 61 GB in BF16 and about 31 GB at INT8, more
than a 24 GiB machine holds; 24 layers are about 16 GB at INT8.

Output folder (same files as a Hugging Face Qwen3-VL-*-Instruct repository):
    config.json, generation_config.json, preprocessor_config.json,
    video_preprocessor_config.json, chat_template.json, tokenizer.json, tokenizer_config.json,
    model-0000N-of-0000M.safetensors (BF16, about 2 GB each), model.safetensors.index.json

Needs only numpy (no torch, no safetensors package): the safetensors files are written by
write_safetensors() below.  Values: float32 N(0, 0.02) rounded to bfloat16 (round to nearest
even on the top 16 bits); norm weights 1 + N(0, 0.02).  Each tensor has its own random stream
seeded from (--seed, crc32(name)), so the values do not depend on the shard layout.

Shapes are the published Qwen3-VL-{2B,4B,8B}-Instruct and Qwen3.5-{2B,9B} config.json values;
tensor names are the ones transformers expects (model.visual.*, model.language_model.*,
lm_head.weight only when the embeddings are not tied).  The tokenizer comes from
tests/data/tokenizer (Qwen3's: Qwen3.5's own 248,320-token tokenizer is not in the repository,
and random weights do not care) and the chat template from
tests/model/fixtures/chat_template/chat_template.jinja.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = REPO / "tests" / "data" / "tokenizer"
TEMPLATE_PATH = REPO / "tests" / "model" / "fixtures" / "chat_template" / "chat_template.jinja"

# Qwen3-VL-{2B,4B,8B}-Instruct config.json values
SHAPES = {
    "2b": dict(layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, intermediate=6144,
               tie=True, v_depth=24, v_hidden=1024, v_heads=16, v_intermediate=4096,
               deepstack=[5, 11, 17], params=2_127_532_032),
    "4b": dict(layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128, intermediate=9728,
               tie=True, v_depth=24, v_hidden=1024, v_heads=16, v_intermediate=4096,
               deepstack=[5, 11, 17], params=4_437_815_808),
    "8b": dict(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288,
               tie=False, v_depth=27, v_hidden=1152, v_heads=16, v_intermediate=4304,
               deepstack=[8, 16, 24], params=8_767_123_696),
    # Qwen3-VL-{30B-A3B,235B-A22B}-Instruct: sparse MLPs in every layer (decoder_sparse_step 1,
    # no mlp_only_layers), top-8 of 128 experts, renormalised.
    "30b-a3b": dict(layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128,
                    intermediate=6144, tie=False, v_depth=27, v_hidden=1152, v_heads=16,
                    v_intermediate=4304, deepstack=[8, 16, 24], params=31_070_754_032,
                    experts=128, top_k=8, moe_intermediate=768),
    "235b-a22b": dict(layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128,
                      intermediate=12288, tie=False, v_depth=27, v_hidden=1152, v_heads=16,
                      v_intermediate=4304, deepstack=[8, 16, 24],
                      params=235_670_022_896, experts=128, top_k=8, moe_intermediate=1536),
    # Qwen/Qwen3.5-{2B,9B} (model_type qwen3_5): 3 linear-attention layers to 1 full, partial
    # rotary (64 of 256 dims), the vision tower without DeepStack, one MTP layer.
    "qwen3.5-2b": dict(qwen35=True, layers=24, hidden=2048, heads=8, kv_heads=2, head_dim=256,
                       intermediate=6144, tie=True, lin_k_heads=16, lin_v_heads=16, lin_dim=128,
                       v_depth=24, v_hidden=1024, v_heads=16, v_intermediate=4096, deepstack=[],
                       params=2_274_069_824),
    "qwen3.5-9b": dict(qwen35=True, layers=32, hidden=4096, heads=16, kv_heads=4, head_dim=256,
                       intermediate=12288, tie=False, lin_k_heads=16, lin_v_heads=32,
                       lin_dim=128, v_depth=27, v_hidden=1152, v_heads=16, v_intermediate=4304,
                       deepstack=[], params=9_653_104_368),
    # Qwen/Qwen3.5-35B-A3B (model_type qwen3_5_moe; Qwen3.6-35B-A3B has the same shape): every
    # layer's MLP top-8 of 256 experts plus a shared expert, no dense MLP.
    "35b-a3b": dict(qwen35=True, layers=40, hidden=2048, heads=16, kv_heads=2, head_dim=256,
                    intermediate=None, tie=False, lin_k_heads=16, lin_v_heads=32, lin_dim=128,
                    v_depth=27, v_hidden=1152, v_heads=16, v_intermediate=4304, deepstack=[],
                    params=35_951_822_704, experts=256, top_k=8, moe_intermediate=512,
                    shared_intermediate=512),
}
VOCAB = 151936
VOCAB_35 = 248320
CONV_KERNEL = 4
# Published Qwen3.5 checkpoints hold these in F32 (everything else BF16).
F32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")
# Zero-centred RMSNorm weights of Qwen3.5 (scaled by 1 + w): random around 0, not 1.
ZERO_CENTRED = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
                "k_norm.weight", "language_model.norm.weight", "mtp.norm.weight",
                "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")
PATCH, TEMPORAL, MERGE, IN_CH, POS_EMB = 16, 2, 2, 3, 2304
MAX_SHARD_BYTES = 2_000_000_000
CHUNK = 1 << 24  # elements generated per numpy call


def tensor_table(s: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) in transformers' state_dict order."""
    t: list[tuple[str, tuple[int, ...]]] = []
    D, I, out = s["v_hidden"], s["v_intermediate"], s["hidden"]
    M = D * MERGE * MERGE
    v = "model.visual."
    t += [(v + "patch_embed.proj.weight", (D, IN_CH, TEMPORAL, PATCH, PATCH)),
          (v + "patch_embed.proj.bias", (D,)),
          (v + "pos_embed.weight", (POS_EMB, D))]
    for b in range(s["v_depth"]):
        p = f"{v}blocks.{b}."
        t += [(p + "norm1.weight", (D,)), (p + "norm1.bias", (D,)),
              (p + "norm2.weight", (D,)), (p + "norm2.bias", (D,)),
              (p + "attn.qkv.weight", (3 * D, D)), (p + "attn.qkv.bias", (3 * D,)),
              (p + "attn.proj.weight", (D, D)), (p + "attn.proj.bias", (D,)),
              (p + "mlp.linear_fc1.weight", (I, D)), (p + "mlp.linear_fc1.bias", (I,)),
              (p + "mlp.linear_fc2.weight", (D, I)), (p + "mlp.linear_fc2.bias", (D,))]
    # main merger: LayerNorm over D before the 2x2 shuffle; DeepStack mergers: over 4D after it
    mergers = [(v + "merger.", D)] + [(f"{v}deepstack_merger_list.{k}.", M)
                                       for k in range(len(s["deepstack"]))]
    for p, norm_dim in mergers:
        t += [(p + "norm.weight", (norm_dim,)), (p + "norm.bias", (norm_dim,)),
              (p + "linear_fc1.weight", (M, M)), (p + "linear_fc1.bias", (M,)),
              (p + "linear_fc2.weight", (out, M)), (p + "linear_fc2.bias", (out,))]
    if s.get("qwen35"):
        return t + qwen35_text_table(s)
    H, nh, nkv, hd, FF = s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["intermediate"]
    lm = "model.language_model."
    t.append((lm + "embed_tokens.weight", (VOCAB, H)))
    for layer in range(s["layers"]):
        p = f"{lm}layers.{layer}."
        t += [(p + "self_attn.q_proj.weight", (nh * hd, H)),
              (p + "self_attn.k_proj.weight", (nkv * hd, H)),
              (p + "self_attn.v_proj.weight", (nkv * hd, H)),
              (p + "self_attn.o_proj.weight", (H, nh * hd)),
              (p + "self_attn.q_norm.weight", (hd,)),
              (p + "self_attn.k_norm.weight", (hd,))]
        if "experts" in s:
            E, Ie = s["experts"], s["moe_intermediate"]
            t += [(p + "mlp.gate.weight", (E, H)),
                  (p + "mlp.experts.gate_up_proj", (E, H, 2 * Ie)),
                  (p + "mlp.experts.down_proj", (E, Ie, H))]
        else:
            t += [(p + "mlp.gate_proj.weight", (FF, H)),
                  (p + "mlp.up_proj.weight", (FF, H)),
                  (p + "mlp.down_proj.weight", (H, FF))]
        t += [
              (p + "input_layernorm.weight", (H,)),
              (p + "post_attention_layernorm.weight", (H,))]
    t.append((lm + "norm.weight", (H,)))
    if not s["tie"]:
        t.append(("lm_head.weight", (VOCAB, H)))
    return t


def qwen35_mlp(p: str, s: dict) -> list[tuple[str, tuple[int, ...]]]:
    """A Qwen3.5 layer's MLP: dense, or (35b-a3b) the router, the fused experts in nn.Linear's
    layout per expert ([E, 2 * I, hidden]: gate rows then up rows; [E, hidden, I]), the shared
    expert and its gate."""
    H = s["hidden"]
    if "experts" not in s:
        FF = s["intermediate"]
        return [(p + "mlp.gate_proj.weight", (FF, H)), (p + "mlp.up_proj.weight", (FF, H)),
                (p + "mlp.down_proj.weight", (H, FF))]
    E, Ie, Is = s["experts"], s["moe_intermediate"], s["shared_intermediate"]
    return [(p + "mlp.gate.weight", (E, H)),
            (p + "mlp.experts.gate_up_proj", (E, 2 * Ie, H)),
            (p + "mlp.experts.down_proj", (E, H, Ie)),
            (p + "mlp.shared_expert.gate_proj.weight", (Is, H)),
            (p + "mlp.shared_expert.up_proj.weight", (Is, H)),
            (p + "mlp.shared_expert.down_proj.weight", (H, Is)),
            (p + "mlp.shared_expert_gate.weight", (1, H))]


def qwen35_attention(p: str, s: dict) -> list[tuple[str, tuple[int, ...]]]:
    """A Qwen3.5 gated attention layer's tensors (q_proj: a gate row per query row) and MLP."""
    H, nh, nkv, hd = s["hidden"], s["heads"], s["kv_heads"], s["head_dim"]
    return [(p + "self_attn.q_proj.weight", (2 * nh * hd, H)),
            (p + "self_attn.k_proj.weight", (nkv * hd, H)),
            (p + "self_attn.v_proj.weight", (nkv * hd, H)),
            (p + "self_attn.o_proj.weight", (H, nh * hd)),
            (p + "self_attn.q_norm.weight", (hd,)),
            (p + "self_attn.k_norm.weight", (hd,))] + qwen35_mlp(p, s) + [
            (p + "input_layernorm.weight", (H,)),
            (p + "post_attention_layernorm.weight", (H,))]


def qwen35_text_table(s: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Qwen3.5's decoder: every 4th layer gated attention, the others Gated DeltaNet; the MTP
    head (one attention layer after fc over [embedding | hidden])."""
    H = s["hidden"]
    nk, nv, d = s["lin_k_heads"], s["lin_v_heads"], s["lin_dim"]
    conv = 2 * nk * d + nv * d
    lm = "model.language_model."
    t = [(lm + "embed_tokens.weight", (VOCAB_35, H))]
    for layer in range(s["layers"]):
        p = f"{lm}layers.{layer}."
        if (layer + 1) % 4 == 0:
            t += qwen35_attention(p, s)
            continue
        a = p + "linear_attn."
        t += [(a + "in_proj_qkv.weight", (conv, H)), (a + "in_proj_z.weight", (nv * d, H)),
              (a + "in_proj_b.weight", (nv, H)), (a + "in_proj_a.weight", (nv, H)),
              (a + "conv1d.weight", (conv, 1, CONV_KERNEL)), (a + "A_log", (nv,)),
              (a + "dt_bias", (nv,)), (a + "norm.weight", (d,)),
              (a + "out_proj.weight", (H, nv * d))]
        t += qwen35_mlp(p, s)
        t += [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,))]
    t.append((lm + "norm.weight", (H,)))
    if not s["tie"]:
        t.append(("lm_head.weight", (VOCAB_35, H)))
    t += [("mtp.fc.weight", (H, 2 * H)), ("mtp.pre_fc_norm_embedding.weight", (H,)),
          ("mtp.pre_fc_norm_hidden.weight", (H,))]
    t += qwen35_attention("mtp.layers.0.", s)
    t.append(("mtp.norm.weight", (H,)))
    return t


# --fp8: the text decoder's linear weights in Qwen's block FP8 (filled by fp8_table).
FP8_WEIGHTS: set = set()
FP8_BLOCK = 128


# --gptq: the text decoder's linear weights in GPTQ's layout (filled by gptq_table).
GPTQ = {"group": 0, "act_order": False}


def dtype_of(name: str) -> str:
    if name in FP8_WEIGHTS:
        return "F8_E4M3"
    if GPTQ["group"] and name.endswith((".qweight", ".qzeros", ".g_idx")):
        return "I32"
    if GPTQ["group"] and name.endswith(".scales"):
        return "F16"
    if name.endswith(F32_SUFFIXES) or name.endswith("_scale_inv"):
        return "F32"
    return "BF16"


def nbytes_of(name: str, shape) -> int:
    return {"F32": 4, "I32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1}[dtype_of(name)] * numel(shape)


def fp8_table(tensors: list) -> list:
    """Qwen's *-FP8 layout: each 2-D text-decoder projection (not a router, not lm_head) as
    F8_E4M3 with its F32 weight_scale_inv [ceil(N/128), ceil(K/128)] after it."""
    out = []
    for name, shape in tensors:
        out.append((name, shape))
        if ("language_model.layers." in name and name.endswith(".weight") and len(shape) == 2
                and "norm" not in name.split(".")[-2]
                and not name.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))):
            FP8_WEIGHTS.add(name)
            out.append((name + "_scale_inv", (-(-shape[0] // FP8_BLOCK),
                                              -(-shape[1] // FP8_BLOCK))))
    return out


def gptq_table(tensors: list, group: int) -> list:
    """GPTQ's layout: each 2-D text-decoder projection (not a router, not lm_head) as its
    qweight, qzeros, scales and g_idx."""
    out = []
    for name, shape in tensors:
        if not ("language_model.layers." in name and name.endswith(".weight") and len(shape) == 2
                and "norm" not in name.split(".")[-2]
                and not name.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))):
            out.append((name, shape))
            continue
        base, (n, k) = name[: -len(".weight")], shape
        out += [(base + ".qweight", (k // 8, n)), (base + ".qzeros", (k // group, n // 8)),
                (base + ".scales", (k // group, n)), (base + ".g_idx", (k,))]
    return out


def write_gptq_data(f, name: str, shape, rng) -> None:
    if name.endswith(".qweight"):
        f.write(rng.integers(0, 2**32, size=numel(shape), dtype=np.uint32).data)
    elif name.endswith(".qzeros"):
        f.write(np.full(numel(shape), 0x77777777, dtype=np.uint32).data)
    elif name.endswith(".scales"):
        u = rng.uniform(-0.5, 0.5, size=numel(shape)).astype(np.float32)
        f.write((np.float32(0.02 / 4) * np.exp2(u)).astype(np.float16).data)
    else:
        g = (np.arange(shape[0]) // GPTQ["group"]).astype(np.int32)
        f.write((rng.permutation(g) if GPTQ["act_order"] else g).data)


def e4m3_values() -> np.ndarray:
    """The 127 non-negative finite E4M3 values in byte order (0x00 .. 0x7E), increasing."""
    b = np.arange(127)
    e, m = b >> 3, b & 7
    return np.where(e == 0, m * 2.0 ** -9, (8 + m) * 2.0 ** (e - 10)).astype(np.float32)


def write_fp8_data(f, name: str, shape, rng) -> None:
    """N(0, 64) in E4M3 (rounded to the nearest value, clipped at 448); scale_inv 0.02 / 64 times
    2^U(-1/2, 1/2) per block, so the weights are about N(0, 0.02) like the BF16 ones."""
    if name.endswith("_scale_inv"):
        u = rng.uniform(-0.5, 0.5, size=numel(shape)).astype(np.float32)
        f.write((np.float32(0.02 / 64) * np.exp2(u)).astype(np.float32).data)
        return
    vals = e4m3_values()
    mids = (vals[1:] + vals[:-1]) / 2
    left = numel(shape)
    while left:
        n = min(left, CHUNK)
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(64)
        code = np.searchsorted(mids, np.minimum(np.abs(x), 448)).astype(np.uint8)
        f.write((code | ((x < 0).astype(np.uint8) << 7)).data)
        left -= n


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (no NaNs expected)."""
    u = x.view(np.uint32)
    u = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (u >> np.uint32(16)).astype(np.uint16)


class _Buffers:
    """Chunk buffers reused for every tensor (avoids 64 MB allocations per chunk)."""

    def __init__(self, n: int):
        self.f32 = np.empty(n, dtype=np.float32)
        self.tmp = np.empty(n, dtype=np.uint32)
        self.bf16 = np.empty(n, dtype=np.uint16)


def write_tensor_data(f, name: str, shape, seed: int, bufs: _Buffers,
                      zero_centred: bool = False) -> None:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if dtype_of(name) == "F8_E4M3" or name.endswith("_scale_inv"):
        return write_fp8_data(f, name, shape, rng)
    if dtype_of(name) in ("I32", "F16"):
        return write_gptq_data(f, name, shape, rng)
    is_norm_weight = name.endswith(".weight") and "norm" in name.split(".")[-2]
    if zero_centred and name.endswith(ZERO_CENTRED):
        is_norm_weight = False  # Qwen3.5's (1 + w) norms
    left = numel(shape)
    while left:
        n = min(left, CHUNK)
        x, tmp, out = bufs.f32[:n], bufs.tmp[:n], bufs.bf16[:n]
        rng.standard_normal(out=x, dtype=np.float32)
        np.multiply(x, np.float32(0.02), out=x)
        if is_norm_weight:
            np.add(x, np.float32(1.0), out=x)
        if dtype_of(name) == "F32":
            f.write(x.data)
            left -= n
            continue
        # in-place version of f32_to_bf16_bits(x)
        u = x.view(np.uint32)
        np.right_shift(u, np.uint32(16), out=tmp)
        np.bitwise_and(tmp, np.uint32(1), out=tmp)
        np.add(tmp, np.uint32(0x7FFF), out=tmp)
        np.add(u, tmp, out=u)
        np.right_shift(u, np.uint32(16), out=u)
        np.copyto(out, u, casting="unsafe")
        f.write(out.data)
        left -= n


def write_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...]]], seed: int,
                      progress, zero_centred: bool = False) -> None:
    """Minimal safetensors writer: u64 LE header size, JSON header (padded with spaces to a
    multiple of 8), then the raw little-endian tensor bytes back to back."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        nbytes = nbytes_of(name, shape)
        header[name] = {"dtype": dtype_of(name), "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    bufs = _Buffers(CHUNK)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name, shape in tensors:
            write_tensor_data(f, name, shape, seed, bufs, zero_centred)
            progress(nbytes_of(name, shape))


def shard(tensors, max_bytes: int) -> list[list]:
    shards, cur, size = [], [], 0
    for name, shape in tensors:
        nbytes = nbytes_of(name, shape)
        if cur and size + nbytes > max_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += nbytes
    if cur:
        shards.append(cur)
    return shards


def vision_config_json(s: dict, model_type: str) -> dict:
    """The vision tower's config (no DeepStack indexes for Qwen3.5)."""
    return {
        "deepstack_visual_indexes": list(s["deepstack"]),
        "depth": s["v_depth"],
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": s["v_hidden"],
        "in_channels": IN_CH,
        "initializer_range": 0.02,
        "intermediate_size": s["v_intermediate"],
        "model_type": model_type,
        "num_heads": s["v_heads"],
        "num_position_embeddings": POS_EMB,
        "out_hidden_size": s["hidden"],
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
    }


# The special ids of the tokenizer this script ships (tests/data/tokenizer: Qwen3's). Qwen3.5's
# own are 248056 / 248057 / 248053 / 248054 and eos 248044, in its 248,320-token tokenizer, which
# the repository does not hold: the written config names the shipped tokenizer's, so that images,
# videos and chats run end to end.
TOKENIZER_IDS = dict(image=151655, video=151656, vision_start=151652, vision_end=151653,
                     eos=151645)


def qwen35_config_json(s: dict) -> dict:
    """Qwen/Qwen3.5-{2B,9B,35B-A3B}'s config.json (the keys vlm and transformers read), special
    ids aside (TOKENIZER_IDS)."""
    c = qwen35_dense_config_json(s)
    if "experts" not in s:
        return c
    c["architectures"] = ["Qwen3_5MoeForConditionalGeneration"]
    c["model_type"] = "qwen3_5_moe"
    c["vision_config"]["model_type"] = "qwen3_5_moe"
    t = c["text_config"]
    for k in ("intermediate_size", "mlp_only_layers"):
        del t[k]
    t.update({"model_type": "qwen3_5_moe_text", "num_experts": s["experts"],
              "num_experts_per_tok": s["top_k"], "moe_intermediate_size": s["moe_intermediate"],
              "shared_expert_intermediate_size": s["shared_intermediate"],
              "router_aux_loss_coef": 0.001, "output_router_logits": False})
    return c


def qwen35_dense_config_json(s: dict) -> dict:
    L = s["layers"]
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "image_token_id": TOKENIZER_IDS["image"],
        "model_type": "qwen3_5",
        "text_config": {
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_output_gate": True,
            "dtype": "bfloat16",
            "eos_token_id": TOKENIZER_IDS["eos"],
            "full_attention_interval": 4,
            "head_dim": s["head_dim"],
            "hidden_act": "silu",
            "hidden_size": s["hidden"],
            "initializer_range": 0.02,
            "intermediate_size": s["intermediate"],
            "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                            for i in range(L)],
            "linear_conv_kernel_dim": CONV_KERNEL,
            "linear_key_head_dim": s["lin_dim"],
            "linear_num_key_heads": s["lin_k_heads"],
            "linear_num_value_heads": s["lin_v_heads"],
            "linear_value_head_dim": s["lin_dim"],
            "mamba_ssm_dtype": "float32",
            "max_position_embeddings": 262144,
            "mlp_only_layers": [],
            "model_type": "qwen3_5_text",
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False,
            "num_attention_heads": s["heads"],
            "num_hidden_layers": L,
            "num_key_value_heads": s["kv_heads"],
            "rms_norm_eps": 1e-06,
            "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                                "rope_type": "default", "rope_theta": 10000000,
                                "partial_rotary_factor": 0.25},
            "tie_word_embeddings": s["tie"],
            "use_cache": True,
            "vocab_size": VOCAB_35,
        },
        "tie_word_embeddings": s["tie"],
        "transformers_version": "4.57.0.dev0",
        "video_token_id": TOKENIZER_IDS["video"],
        "vision_config": vision_config_json(s, "qwen3_5"),
        "vision_end_token_id": TOKENIZER_IDS["vision_end"],
        "vision_start_token_id": TOKENIZER_IDS["vision_start"],
    }


def config_json(s: dict) -> dict:
    if s.get("qwen35"):
        return qwen35_config_json(s)
    moe = "experts" in s
    c = {
        "architectures": ["Qwen3VLMoeForConditionalGeneration" if moe
                          else "Qwen3VLForConditionalGeneration"],
        "image_token_id": 151655,
        "model_type": "qwen3_vl_moe" if moe else "qwen3_vl",
        "text_config": {
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "dtype": "bfloat16",
            "eos_token_id": 151645,
            "head_dim": s["head_dim"],
            "hidden_act": "silu",
            "hidden_size": s["hidden"],
            "initializer_range": 0.02,
            "intermediate_size": s["intermediate"],
            "max_position_embeddings": 262144,
            "model_type": "qwen3_vl_text",
            "num_attention_heads": s["heads"],
            "num_hidden_layers": s["layers"],
            "num_key_value_heads": s["kv_heads"],
            "rms_norm_eps": 1e-06,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                             "rope_type": "default"},
            "rope_theta": 5000000,
            "tie_word_embeddings": s["tie"],
            "use_cache": True,
            "vocab_size": VOCAB,
        },
        "tie_word_embeddings": s["tie"],
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1",
        "video_token_id": 151656,
        "vision_config": vision_config_json(s, "qwen3_vl"),
        "vision_end_token_id": 151653,
        "vision_start_token_id": 151652,
    }
    if moe:
        c["text_config"].update({
            "model_type": "qwen3_vl_moe_text", "num_experts": s["experts"],
            "num_experts_per_tok": s["top_k"], "moe_intermediate_size": s["moe_intermediate"],
            "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
            "router_aux_loss_coef": 0.001})
        c["vision_config"]["model_type"] = "qwen3_vl_moe"
    return c


GENERATION_CONFIG = {  # as the Instruct checkpoints publish it
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.7,
    "top_k": 20,
    "top_p": 0.8,
    "transformers_version": "4.57.1",
}
PREPROCESSOR_CONFIG = {  # the checkpoints' preprocessor_config.json
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL,
    "merge_size": MERGE,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
VIDEO_PREPROCESSOR_CONFIG = {  # the checkpoints' video_preprocessor_config.json
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL,
    "merge_size": MERGE,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "video_processor_type": "Qwen3VLVideoProcessor",
}


def dump(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output folder (created)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="2b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-shard-bytes", type=int, default=MAX_SHARD_BYTES)
    ap.add_argument("--layers", type=int, default=None,
                    help="keep the first L decoder layers (default: all of the shape's)")
    ap.add_argument("--fp8", action="store_true",
                    help="Qwen's *-FP8 layout: the text decoder's projections in E4M3 with one "
                         "F32 weight_scale_inv per 128 x 128 block (dense shapes)")
    ap.add_argument("--gptq", type=int, default=0, metavar="G",
                    help="GPTQ's 4-bit layout, groups of G (dense shapes)")
    ap.add_argument("--act-order", action="store_true",
                    help="with --gptq: desc_act's g_idx (the groups over a random column order)")
    args = ap.parse_args()

    s = dict(SHAPES[args.shape])
    if args.layers is not None:
        if not 1 <= args.layers <= s["layers"]:
            ap.error(f"--layers must be in [1, {s['layers']}]")
        s["layers"], s["params"] = args.layers, None
    tensors = tensor_table(s)
    total_params = sum(numel(shape) for _, shape in tensors)
    if s["params"] is not None and total_params != s["params"]:
        raise SystemExit(f"parameter count {total_params} != expected {s['params']}")
    if args.fp8:
        if "experts" in s:
            ap.error("--fp8 writes the dense shapes (Qwen's MoE FP8 stores one tensor per expert)")
        tensors = fp8_table(tensors)
    if args.gptq:
        if "experts" in s or args.fp8:
            ap.error("--gptq writes the dense shapes, without --fp8")
        GPTQ.update(group=args.gptq, act_order=args.act_order)
        tensors = gptq_table(tensors, args.gptq)
    total_bytes = sum(nbytes_of(name, shape) for name, shape in tensors)
    qwen35 = bool(s.get("qwen35"))
    tok_dir = TOKENIZER_DIR
    template = TEMPLATE_PATH.read_text(encoding="utf-8")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("model*.safetensors")) + list(out.glob("model.safetensors.index.json")):
        old.unlink()

    cfg = config_json(s)
    if args.fp8:
        cfg["quantization_config"] = {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
            "modules_to_not_convert": ["lm_head", "model.embed_tokens"]}
    if args.gptq:
        cfg["quantization_config"] = {
            "quant_method": "gptq", "bits": 4, "group_size": args.gptq, "sym": True,
            "desc_act": args.act_order, "checkpoint_format": "gptq", "pack_dtype": "int32",
            "lm_head": False}
    dump(out / "config.json", cfg)
    if qwen35:
        (out / "generation_config.json").unlink(missing_ok=True)  # none published
    else:
        dump(out / "generation_config.json", GENERATION_CONFIG)
    dump(out / "preprocessor_config.json", PREPROCESSOR_CONFIG)
    dump(out / "video_preprocessor_config.json", VIDEO_PREPROCESSOR_CONFIG)
    dump(out / "chat_template.json", {"chat_template": template})
    shutil.copyfile(tok_dir / "tokenizer.json", out / "tokenizer.json")
    tok_cfg = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok_cfg["chat_template"] = template  # the Qwen3-VL Instruct template, not Qwen3 text's
    dump(out / "tokenizer_config.json", tok_cfg)

    shards = shard(tensors, args.max_shard_bytes)
    n = len(shards)
    weight_map = {}
    t0 = time.time()
    done = [0, 0]  # bytes written, last printed percentage step

    def progress(nbytes: int) -> None:
        done[0] += nbytes
        step = done[0] * 20 // total_bytes
        if step != done[1]:
            done[1] = step
            el = time.time() - t0
            print(f"  {done[0] / 1e9:6.2f} / {total_bytes / 1e9:.2f} GB  {el:6.1f}s  "
                  f"{done[0] / 1e6 / max(el, 1e-9):6.0f} MB/s", flush=True)

    print(f"{args.shape}: {len(tensors)} tensors, {total_params:,} params, "
          f"{total_bytes / 1e9:.2f} GB in {n} shard(s) -> {out}", flush=True)
    for i, part in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        write_safetensors(out / fname, part, args.seed, progress, zero_centred=qwen35)
        for name, _ in part:
            weight_map[name] = fname
    index = {"metadata": {"total_size": total_bytes},
             "weight_map": dict(sorted(weight_map.items()))}
    dump(out / "model.safetensors.index.json", index)
    print(f"done in {time.time() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
