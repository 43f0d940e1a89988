#!/usr/bin/env python3
"""Build the pre-quantized checkpoint fixtures (tests/model/fixtures/prequant-*) and their
references.

Each fixture is a tiny random checkpoint of tests/model/fixtures (Qwen3-VL: the dense
text-f32-untied, the mixture of experts moe-f32-e8k2; Qwen3.5: qwen35-f32-a, qwen35moe-f32-a) or
the Qwen3-VL demo model (models/tiny-qwen3vl), quantized by the real tools:

* llm-compressor's ``oneshot`` with a ``QuantizationModifier`` (round to nearest, no calibration
  data; w4a16-g32-actorder: a ``GPTQModifier``, calibrated), saved with ``save_compressed=True`` in the compressed-tensors format:
    - w4a16-g32: 4-bit integers, groups of 32, asymmetric (zero points); ``pack-quantized``.
    - w4a16-g64-moe: the MoE model, 4-bit symmetric groups of 64, every expert unfused by
      llm-compressor's own Qwen3-VL MoE calibration module (as its MoE recipes do), on the f32
      weights: F32 scales, which vlm rounds to f16 (and says so).
    - w8a8: the ``W8A8`` preset (int8 weights per channel, dynamic int8 activations);
      ``int-quantized``.
    - fp8-dynamic: the ``FP8_DYNAMIC`` preset (E4M3 weights per channel); ``float-quantized``.
    - w8a16: the ``W8A16`` preset (int8 weights per channel packed four to an int32 word);
      ``pack-quantized``.
    - w4a16-channel-asym: 4-bit integers with one scale and zero point per row.
    - w4a16-g32-actorder: llm-compressor's GPTQModifier (GPTQ, calibrated on 16 rows of 64 seeded
      random token ids) with ``actorder: group``: 4-bit symmetric groups of 32 over the columns'
      activation order, a ``weight_g_idx`` per column.
    - qwen35-w4a16-g32, qwen35moe-w4a16-g32: Qwen3.5, 4-bit symmetric groups of 32 (the Gated
      DeltaNet's projections too; the MoE's experts, which llm-compressor unfuses by itself, and
      its shared expert).
    - demo-w4a16 (groups of 32: the demo's rows of 320 are not a multiple of 128), demo-w8a8: the
      demo model, its vision tower quantized too.
  The ignore list: lm_head, the vision tower, the routers (``re:.*mlp.gate$``,
  ``re:.*shared_expert_gate$``); the demo's: lm_head alone.
* Qwen's block-FP8 layout written by this script (Qwen publishes its *-FP8 checkpoints so; no
  PyPI tool writes it): every text-decoder projection but the routers as F8_E4M3 with one F32
  ``weight_scale_inv`` per 128 x 128 block (amax / 448; edge blocks partial: these shapes have
  rows and columns of 32 and 64), the experts one tensor per expert (as Qwen's MoE FP8
  checkpoints store them), the rest in BF16 as published (Qwen3.5's A_log and gated norm F32);
  ``quant_method: fp8``, ``modules_to_not_convert: [lm_head, model.embed_tokens]``, the vision
  tower not listed and left as stored.
    - fp8-block (dense), fp8-block-moe, qwen35-fp8-block, qwen35moe-fp8-block.
  The fixtures marked bf16=True below are made from the weights rounded to BF16 (BF16 scales, as
  published checkpoints have them); the others from the f32 weights.

The reference: transformers (f32, eager) on the source model with every quantized weight
replaced by its dequantized value computed **in f32** by this script as the format defines it
((q - zero) * scale; e4m3 * scale_inv), every other tensor as the quantized checkpoint stores it:
the logits over the source fixture's prompts (logits_*.npy, reference.json "logits"), or for the
demo model its greedy answers to the 100 held-out scenes of tests/model/fixtures/shapes-qa
(reference.json "cases", "transformers_accuracy"). For the compressed-tensors fixtures each
dequantized weight is checked equal to compressed-tensors' own decompression (its scales widened
to f32): reference.json "decompress_max_abs_diff".

Usage (CPU; deterministic; about a minute; without --only, every fixture the installed
transformers makes):
    PREQUANT_VENV/bin/python scripts/make_prequant_reference.py --only w4a16-g32 ...
        (the Qwen3-VL ones: scripts/requirements-prequant.txt, transformers 4.57.1)
    PREQUANT5_VENV/bin/python scripts/make_prequant_reference.py --only qwen35-fp8-block ...
        (the Qwen3.5 ones: scripts/requirements-prequant-qwen35.txt, transformers 5.x)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import make_reference as mr

SOURCES = {"dense": "text-f32-untied", "moe": "moe-f32-e8k2", "qwen35": "qwen35-f32-a",
           "qwen35moe": "qwen35moe-f32-a"}
IGNORE = ["lm_head", "re:.*visual.*", "re:.*mlp.gate$", "re:.*shared_expert_gate$"]

FIXTURES = {
    "w4a16-g32": dict(source="dense", tool="llmcompressor", bf16=True,
                      weights=dict(num_bits=4, type="int", symmetric=False, strategy="group",
                                   group_size=32)),
    "w4a16-g64-moe": dict(source="moe", tool="llmcompressor",  # f32 scales
                          weights=dict(num_bits=4, type="int", symmetric=True, strategy="group",
                                       group_size=64)),
    "w8a8": dict(source="dense", tool="llmcompressor", preset="W8A8", bf16=True),
    "fp8-dynamic": dict(source="dense", tool="llmcompressor", preset="FP8_DYNAMIC", bf16=True),
    "w8a16": dict(source="dense", tool="llmcompressor", preset="W8A16", bf16=True),
    "w4a16-channel-asym": dict(source="dense", tool="llmcompressor", bf16=True,
                               weights=dict(num_bits=4, type="int", symmetric=False,
                                            strategy="channel")),
    "w4a16-g32-actorder": dict(source="dense", tool="llmcompressor", bf16=True, gptq=True,
                               weights=dict(num_bits=4, type="int", symmetric=True,
                                            strategy="group", group_size=32, actorder="group")),
    "fp8-block": dict(source="dense", tool="qwen-fp8", bf16=True),
    "fp8-block-moe": dict(source="moe", tool="qwen-fp8"),
    # Qwen3.5 (transformers 5.x: scripts/requirements-prequant-qwen35.txt).
    "qwen35-w4a16-g32": dict(source="qwen35", tool="llmcompressor", bf16=True,
                             weights=dict(num_bits=4, type="int", symmetric=True,
                                          strategy="group", group_size=32)),
    "qwen35moe-w4a16-g32": dict(source="qwen35moe", tool="llmcompressor", bf16=True,
                                weights=dict(num_bits=4, type="int", symmetric=True,
                                             strategy="group", group_size=32)),
    "qwen35-fp8-block": dict(source="qwen35", tool="qwen-fp8", bf16=True),
    "qwen35moe-fp8-block": dict(source="qwen35moe", tool="qwen-fp8"),
    # The Qwen3-VL demo model (models/tiny-qwen3vl: rows of 128 and 320, so groups of 32) and its
    # 100 held-out scenes (tests/model/fixtures/shapes-qa): transformers' answers on the
    # dequantized weights instead of logits. The vision tower is quantized too (lm_head alone
    # ignored): 8.8 of the model's 9.4 MB are the tower's, and vlm's load of a quantized tower
    # (dequantized to f32) is tested so.
    "demo-w4a16": dict(source="demo", tool="llmcompressor", ignore=["lm_head"],
                       weights=dict(num_bits=4, type="int", symmetric=True, strategy="group",
                                    group_size=32)),
    "demo-w8a8": dict(source="demo", tool="llmcompressor", preset="W8A8", ignore=["lm_head"]),
}
DEMO = mr.REPO / "models" / "tiny-qwen3vl"
DEMO_FILES = ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json",
              "video_preprocessor_config.json")


def source_dir(kind: str) -> Path:
    return DEMO if kind == "demo" else mr.FIXTURES / SOURCES[kind]


def load_source(kind: str):
    import transformers
    path = source_dir(kind)
    arch = json.loads((path / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, arch).from_pretrained(path, dtype=torch.float32,
                                                        attn_implementation="eager")
    return model.eval()


def linear_layout_experts(cfg: dict) -> bool:
    """Qwen3.5 MoE's fused experts are nn.Linear's layout per expert ([E, 2I, H], [E, H, I]);
    Qwen3-VL MoE's are transposed ([E, H, 2I], [E, I, H])."""
    return cfg.get("model_type", "").startswith("qwen3_5")


def unfuse_moe(model) -> None:
    """llm-compressor's Qwen3-VL MoE calibration module: one nn.Linear per expert."""
    from llmcompressor.modeling.qwen3_vl_moe import CalibrateQwen3VLMoeTextSparseMoeBlock
    for layer in model.model.language_model.layers:
        if type(layer.mlp).__name__ == "Qwen3VLMoeTextSparseMoeBlock":
            layer.mlp = CalibrateQwen3VLMoeTextSparseMoeBlock(layer.mlp, model.config, True)


def run_llmcompressor(spec: dict, out: Path) -> None:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    model = load_source(spec["source"])
    if spec["source"] == "moe":
        unfuse_moe(model)
    if spec.get("bf16"):
        model = model.to(torch.bfloat16)
    if "preset" in spec:
        recipe = QuantizationModifier(targets="Linear", scheme=spec["preset"],
                                      ignore=spec.get("ignore", IGNORE))
    else:
        scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**spec["weights"]))
        modifier = GPTQModifier if spec.get("gptq") else QuantizationModifier
        recipe = modifier(config_groups={"group_0": scheme}, ignore=spec.get("ignore", IGNORE))
    if spec.get("gptq"):  # calibrated: 16 rows of 64 seeded random token ids
        from datasets import Dataset
        from transformers import AutoTokenizer
        g = torch.Generator().manual_seed(0)
        ids = [torch.randint(0, 1000, (64,), generator=g).tolist() for _ in range(16)]
        ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 64] * 16})
        oneshot(model=model, recipe=recipe, dataset=ds, processor=AutoTokenizer.from_pretrained(
            str(DEMO)), num_calibration_samples=16, max_seq_length=64)
    else:
        oneshot(model=model, recipe=recipe)
    model.save_pretrained(out, save_compressed=True)


def e4m3_blocks(w: torch.Tensor, block: int = 128, scale_dtype=torch.float32):
    """Qwen's block FP8: per 128 x 128 block scale = amax / 448 (stored in scale_dtype, the
    quantization dividing by the stored value), e4m3 = w / scale."""
    n, k = w.shape
    rb, cb = -(-n // block), -(-k // block)
    scale = torch.zeros(rb, cb, dtype=torch.float32)
    q = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    for i in range(rb):
        for j in range(cb):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            s = (blk.abs().max().clamp(min=1e-12) / 448.0).to(scale_dtype).float()
            scale[i, j] = s
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = (blk / s).to(
                torch.float8_e4m3fn)
    return q, scale.to(scale_dtype)


def write_qwen_fp8(spec: dict, out: Path) -> None:
    src = source_dir(spec["source"])
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.npy", "reference.json", "*.png",
                                                            "*tokenizer*", "*preprocessor*"))
    tensors = {}
    with safe_open(src / "model.safetensors", "pt") as f:
        for name in f.keys():
            tensors[name] = f.get_tensor(name)
    linear_layout = linear_layout_experts(json.loads((src / "config.json").read_text()))
    out_t = {}
    for name, t in tensors.items():  # fused experts first split into one nn.Linear per expert
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                x = t[e] if linear_layout else t[e].T  # [2I, H]
                inter = x.shape[0] // 2
                out_t[f"{base}{e}.gate_proj.weight"] = x[:inter].contiguous()
                out_t[f"{base}{e}.up_proj.weight"] = x[inter:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out_t[f"{base}{e}.down_proj.weight"] = (t[e] if linear_layout
                                                        else t[e].T).contiguous()
        else:
            out_t[name] = t
    final = {}
    for name, t in out_t.items():
        linear = (name.startswith("model.language_model.layers.") and name.endswith(".weight")
                  and t.dim() == 2 and "norm" not in name.split(".")[-2]
                  and not name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")))
        if linear:  # (Qwen's published scales are F32 or BF16: the bf16 fixtures take BF16)
            q, s = e4m3_blocks(t.float(),
                               scale_dtype=torch.bfloat16 if spec.get("bf16") else torch.float32)
            final[name] = q
            final[name + "_scale_inv"] = s
        else:  # Qwen publishes the rest in BF16 (Qwen3.5's A_log and gated norm in F32)
            keep_f32 = name.endswith(("A_log", "linear_attn.norm.weight"))
            final[name] = t.to(torch.bfloat16) if spec.get("bf16") and not keep_f32 else t
    save_file(final, out / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                  "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                                  "modules_to_not_convert": ["lm_head", "model.embed_tokens"]}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


# ------------------------------------------------------------------------------------------------
# dequantization in f32, as the formats define it
# ------------------------------------------------------------------------------------------------

def unpack(words: np.ndarray, bits: int, length: int, dim: int = 1) -> np.ndarray:
    """compressed-tensors' packing: value i of a word at bits (bits * i), stored + 2^(bits-1),
    packed along `dim`, `length` values long."""
    if dim == 0:
        return unpack(words.T, bits, length, 1).T
    w = words.astype(np.uint32)
    vals = np.stack([(w >> np.uint32(bits * i)) & np.uint32((1 << bits) - 1)
                     for i in range(32 // bits)], axis=-1).reshape(w.shape[0], -1)[:, :length]
    return vals.astype(np.int32) - (1 << (bits - 1))


def expand(scale: np.ndarray, n: int, k: int, args: dict, g_idx=None) -> np.ndarray:
    strategy = args.get("strategy")
    if strategy == "group" and g_idx is not None:  # actorder group: column k's group g_idx[k]
        return scale[:, g_idx]
    if strategy == "group":
        return np.repeat(scale, args["group_size"], axis=1)[:, :k]
    if strategy == "block":
        bn, bk = args["block"] if "block" in args else args["block_structure"]
        return np.repeat(np.repeat(scale, bn, axis=0), bk, axis=1)[:n, :k]
    return np.broadcast_to(scale.reshape(-1, 1) if scale.size == n else scale.reshape(1, 1),
                           (n, k))


def f32(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy()


def dequantize(path: Path) -> tuple[dict, dict, dict]:
    """(dequantized f32 weights by tensor name, the other tensors as stored, compressed data and
    args per module for the decompression check)."""
    cfg = json.loads((path / "config.json").read_text())["quantization_config"]
    f = safe_open(path / "model.safetensors", "pt")
    names = set(f.keys())
    deq, plain, raw = {}, {}, {}
    if cfg["quant_method"] == "fp8":
        bn, bk = cfg["weight_block_size"]
        for name in names:
            t = f.get_tensor(name)
            if name.endswith("_scale_inv"):
                continue
            if t.dtype == torch.float8_e4m3fn:
                s = f32(f.get_tensor(name + "_scale_inv"))
                n, k = t.shape
                deq[name] = f32(t) * expand(s, n, k, dict(strategy="block", block=(bn, bk)))
            else:
                plain[name] = t
        return deq, plain, raw
    args = next(iter(cfg["config_groups"].values()))["weights"]
    for name in names:
        if name.endswith(".weight_packed"):
            base = name[: -len(".weight_packed")]
            n, k = (int(x) for x in f.get_tensor(base + ".weight_shape"))
            q = unpack(f.get_tensor(name).numpy(), args["num_bits"], k)
        elif name.endswith(".weight") and f.get_tensor(name).dtype in (torch.int8,
                                                                       torch.float8_e4m3fn):
            base = name[: -len(".weight")]
            q = f32(f.get_tensor(name))
            n, k = q.shape
        else:
            if not any(name.endswith(s) for s in ("_scale", "_zero_point", "_shape", "_g_idx")):
                plain[name] = f.get_tensor(name)
            continue
        scale = f32(f.get_tensor(base + ".weight_scale"))
        g_idx = (f.get_tensor(base + ".weight_g_idx").numpy().astype(np.int64)
                 if base + ".weight_g_idx" in names else None)
        zero = np.zeros((n, k), np.float32)
        if base + ".weight_zero_point" in names:
            zp = f.get_tensor(base + ".weight_zero_point")
            zp = (unpack(zp.numpy(), args["num_bits"], n, dim=0) if zp.dtype == torch.int32
                  else zp.numpy())
            zero = expand(zp.astype(np.float32), n, k, args, g_idx)
        deq[base + ".weight"] = (q.astype(np.float32) - zero) * expand(scale, n, k, args, g_idx)
        raw[base] = {s: f.get_tensor(base + s) for s in
                     (".weight_packed", ".weight", ".weight_scale", ".weight_zero_point",
                      ".weight_shape", ".weight_g_idx") if base + s in names}
    return deq, plain, raw


def check_decompression(path: Path, deq: dict, raw: dict) -> float:
    """compressed-tensors' own decompress_weight against the script's: the largest |diff|."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    cfg = json.loads((path / "config.json").read_text())["quantization_config"]
    group = next(iter(cfg["config_groups"].values()))
    comp = BaseCompressor.load_from_registry(group["format"])
    args = QuantizationArgs(**group["weights"])
    worst = 0.0
    for base, tensors in raw.items():
        data = {k.lstrip("."): v for k, v in tensors.items()}
        data["weight_scale"] = data["weight_scale"].float()
        if hasattr(comp, "decompress_weight"):  # compressed-tensors < 0.14
            got = comp.decompress_weight(data, args)
        else:
            got = comp.decompress(data, QuantizationScheme(targets=["Linear"],
                                                           weights=args))["weight"]
        got = got.float().numpy()
        worst = max(worst, float(np.abs(got - deq[base + ".weight"]).max()))
    return worst


def reference_model(spec: dict, deq: dict, plain: dict):
    """The source model (f32) with the quantized checkpoint's values: dequantized weights, the
    rest as stored."""
    model = load_source(spec["source"])
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in deq.items()}
    state.update({k: v.float() for k, v in plain.items()})
    fused = {}
    for name in list(state):  # per-expert weights back into the fused parameters
        parts = name.split(".")
        if "experts" in parts and parts[-2].endswith("_proj") and parts[-3].isdigit():
            base = ".".join(parts[:parts.index("experts") + 1])
            fused.setdefault(base, {})[(int(parts[-3]), parts[-2])] = state.pop(name)
    linear_layout = linear_layout_experts(model.config.to_dict())
    for base, experts in fused.items():
        n = 1 + max(e for e, _ in experts)
        if linear_layout:
            state[base + ".gate_up_proj"] = torch.stack(
                [torch.cat([experts[(e, "gate_proj")], experts[(e, "up_proj")]]) for e in range(n)])
            state[base + ".down_proj"] = torch.stack([experts[(e, "down_proj")] for e in range(n)])
            continue
        state[base + ".gate_up_proj"] = torch.stack(
            [torch.cat([experts[(e, "gate_proj")].T, experts[(e, "up_proj")].T], dim=1)
             for e in range(n)])
        state[base + ".down_proj"] = torch.stack([experts[(e, "down_proj")].T for e in range(n)])
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (model.config.tie_word_embeddings and m == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    return model


def demo_answers(model) -> dict:
    """transformers' greedy answers (scripts/train_tiny_vlm.py's) to the 100 held-out scenes."""
    import train_tiny_vlm as tt
    from PIL import Image
    from tokenizers import Tokenizer
    scenes = mr.FIXTURES / "shapes-qa"
    cases = json.loads((scenes / "cases-tiny-qwen3vl.json").read_text())["cases"]
    enc = tt.Encoder(Tokenizer.from_file(str(DEMO / "tokenizer.json")), "qwen3_vl")
    out, right = [], 0
    for c in cases:
        with Image.open(scenes / c["image"]) as f:
            got = tt.answer(model, enc, f.convert("RGB"), c["question"])
        right += got == c["truth"]
        out.append(dict(image=c["image"], question=c["question"], truth=c["truth"],
                        transformers=got))
    return dict(transformers_accuracy=right / len(cases), cases=out)


def make(name: str, spec: dict) -> None:
    out = mr.FIXTURES / ("prequant-" + name)
    if out.exists():
        shutil.rmtree(out)
    if spec["tool"] == "llmcompressor":
        run_llmcompressor(spec, out)
    else:
        write_qwen_fp8(spec, out)
    for junk in ("recipe.yaml",):
        (out / junk).unlink(missing_ok=True)
    if spec["source"] == "demo":
        for f in DEMO_FILES:
            shutil.copyfile(DEMO / f, out / f)
    deq, plain, raw = dequantize(out)
    ref = {"source": "models/tiny-qwen3vl" if spec["source"] == "demo" else SOURCES[spec["source"]],
           "tool": spec["tool"],
           "quantization_config": json.loads((out / "config.json").read_text())[
               "quantization_config"],
           "quantized_matrices": len(deq), "logits": []}
    if raw:
        ref["decompress_max_abs_diff"] = check_decompression(out, deq, raw)
        assert ref["decompress_max_abs_diff"] < 1e-6, ref["decompress_max_abs_diff"]
    model = reference_model(spec, deq, plain)
    if spec["source"] == "demo":
        ref.update(demo_answers(model))
        print(f"  transformers accuracy {ref['transformers_accuracy']:.2f} on the dequantized "
              "weights", flush=True)
    src_ref = ({"logits": []} if spec["source"] == "demo"
               else json.loads((mr.FIXTURES / ref["source"] / "reference.json").read_text()))
    for i, entry in enumerate(src_ref["logits"]):
        fname = f"logits_{i}.npy"
        np.save(out / fname, mr.forward_logits(model, entry["ids"]).astype(np.float32))
        ref["logits"].append({"ids": entry["ids"], "file": fname})
    import compressed_tensors
    import transformers
    ref["versions"] = {"transformers": transformers.__version__, "torch": torch.__version__,
                       "compressed_tensors": compressed_tensors.__version__}
    if spec["tool"] == "llmcompressor":
        import llmcompressor
        ref["versions"]["llmcompressor"] = llmcompressor.__version__
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"{out.name}: {len(deq)} quantized matrices, "
          f"decompress diff {ref.get('decompress_max_abs_diff', '-')}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=None, choices=sorted(FIXTURES))
    args = ap.parse_args()
    import transformers
    torch.manual_seed(0)
    torch.set_num_threads(1)
    five = int(transformers.__version__.split(".")[0]) >= 5
    for name, spec in FIXTURES.items():
        # Without --only: the fixtures of the transformers line installed (Qwen3.5's need 5.x).
        if (args.only and name not in args.only) or (
                not args.only and spec["source"].startswith("qwen35") != five):
            continue
        make(name, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
