#!/usr/bin/env python3
"""Build the GPTQ and AWQ checkpoint fixtures (tests/model/fixtures/prequant-gptq-*,
prequant-awq-*, prequant-demo-gptq-g32, prequant-qwen35-gptq-g32-act) and their references, in
two stages:

1. ``--stage quantize`` (GPTQModel, which needs transformers 5.x: scripts/requirements-gptq.txt):
   each fixture's source (the dense text-f32-untied, the mixture of experts moe-f32-e8k2, Qwen3.5's
   qwen35-f32-a, or the demo model models/tiny-qwen3vl) quantized by GPTQModel's
   ``GPTQModel.load`` / ``quantize`` / ``save`` on CPU, calibrated on 16 rows of 64 random token
   ids (seeded; the fixtures carry no text), written in the format the spec names. Then every
   quantized weight is dequantized by GPTQModel's own code, in f32 — GPTQ: the checkpoint loaded
   with BACKEND.GPTQ_TORCH (its v1 → v2 zero point conversion included), each TorchLinear's
   scales widened to f32 and its ``dequantize_weight()``; AWQ: ``dequantize_gemm`` on the stored
   tensors, scales widened to f32 — and compared with this script's own dequantization (below):
   reference.json "library_max_abs_diff", which must be 0.
2. the reference stage (transformers 4.57.1, as every Qwen3-VL reference:
   scripts/requirements-prequant.txt; Qwen3.5's in transformers 5.x:
   scripts/requirements-prequant-qwen35.txt): transformers (f32, eager) on the source model with
   every quantized weight replaced by this script's f32 dequantization and every other tensor as the
   checkpoint stores it (GPTQModel's AWQ folds its smoothing scales into the norms): the logits
   over the source fixture's prompts, or for the demo model its greedy answers to the 100 held-out
   scenes of tests/model/fixtures/shapes-qa (scripts/make_prequant_reference.py's code).

The dequantization, as the formats define it (W [N, K], group g of column k: g_idx[k] for GPTQ,
k / group_size for AWQ):
  GPTQ: qweight int32 [K·bits/32, N], value k of column n at bits · (k mod 32/bits) of word
        k / (32/bits); qzeros int32 [G, N·bits/32] packed so along N; scales f16 [G, N];
        checkpoint_format gptq (v1) stores the zero points minus one: GPTQModel adds 0x11111111
        (4-bit) or 0x01010101 (8-bit) to each whole int32 word of qzeros (borrows and all).
        W[n, k] = (q[k, n] − z[g, n]) · s[g, n].
  AWQ (GEMM): qweight int32 [K, N/8], column 8c + j of word c at 4 · [0, 4, 1, 5, 2, 6, 3, 7][j];
        qzeros [G, N/8] packed so; scales [G, N]; W[n, k] = (q[k, n] − z[g, n]) · s[g, n].

GPTQModel's Qwen3-VL module tree lacks the norm / input annotations its Qwen3 one has, which AWQ
needs to fold its scales into the right norm (without them it tries q_norm); the quantize stage
gives Qwen3-VL the Qwen3 annotations (gptqmodel_qwen3vl_tree below).

Usage (CPU, deterministic; a few minutes):
    GPTQ_VENV/bin/python scripts/make_gptq_reference.py --stage quantize [--only NAME ...]
    PREQUANT_VENV/bin/python scripts/make_gptq_reference.py [--only NAME ...]
    PREQUANT5_VENV/bin/python scripts/make_gptq_reference.py [--only qwen35-gptq-g32-act]
  (GPTQModel on a machine with 2 cores: GPTQMODEL_CPU_WORKERS=2.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# (Eager: TorchLinear's torch.compile'd dequantization does not take the f32 scales.)
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

import make_prequant_reference as pr  # noqa: E402
import make_reference as mr  # noqa: E402

# name: source, tool (gptq or awq) and the GPTQModel config's fields.
FIXTURES = {
    "gptq-g128": dict(source="dense", tool="gptq",
                      cfg=dict(bits=4, group_size=128, sym=True, desc_act=False, format="gptq")),
    "gptq-g32-act-asym": dict(source="dense", tool="gptq",
                              cfg=dict(bits=4, group_size=32, sym=False, desc_act=True,
                                       format="gptq")),
    "gptq-g64-act-v2": dict(source="dense", tool="gptq",
                            cfg=dict(bits=4, group_size=64, sym=True, desc_act=True,
                                     format="gptq_v2")),
    # (Per row: GPTQModel's act_group_aware, on by default, takes groups only.)
    "gptq-channel-asym-v2": dict(source="dense", tool="gptq",
                                 cfg=dict(bits=4, group_size=-1, sym=False, desc_act=False,
                                          act_group_aware=False, format="gptq_v2")),
    "gptq-int8-g32-act": dict(source="dense", tool="gptq",
                              cfg=dict(bits=8, group_size=32, sym=True, desc_act=True,
                                       format="gptq")),
    "gptq-int8-channel-v2": dict(source="dense", tool="gptq",
                                 cfg=dict(bits=8, group_size=-1, sym=True, desc_act=False,
                                          act_group_aware=False, format="gptq_v2")),
    "gptq-int8-g128-asym": dict(source="dense", tool="gptq",
                                cfg=dict(bits=8, group_size=128, sym=False, desc_act=False,
                                         format="gptq")),
    # dynamic: layer 1's down_proj left in BF16, layer 2 in 8 bits with groups of 64.
    "gptq-dynamic": dict(source="dense", tool="gptq",
                         cfg=dict(bits=4, group_size=32, sym=True, desc_act=False, format="gptq",
                                  dynamic={r"-:.*layers\.1\.mlp\.down_proj": {},
                                           r"+:.*layers\.2\..*": {"bits": 8, "group_size": 64}})),
    # lm_head quantized too (GPTQModel's lm_head=True; the source's head is untied).
    "gptq-g64-lm-head": dict(source="dense", tool="gptq",
                             cfg=dict(bits=4, group_size=64, sym=True, desc_act=False,
                                      lm_head=True, format="gptq")),
    "gptq-moe-g32-act": dict(source="moe", tool="gptq",
                             cfg=dict(bits=4, group_size=32, sym=True, desc_act=True,
                                      format="gptq")),
    "awq-g128": dict(source="dense", tool="awq",
                     cfg=dict(bits=4, group_size=128, sym=False, format="gemm")),
    "awq-g64-sym": dict(source="dense", tool="awq",
                        cfg=dict(bits=4, group_size=64, sym=True, format="gemm")),
    # Qwen3.5 (the reference stage in transformers 5.x: scripts/requirements-prequant-qwen35.txt):
    # the Gated DeltaNet's projections and the gated attention's too.
    "qwen35-gptq-g32-act": dict(source="qwen35", tool="gptq",
                                cfg=dict(bits=4, group_size=32, sym=True, desc_act=True,
                                         format="gptq")),
    # The demo model (rows of 128 and 320): GPTQ 4-bit, groups of 32, GPTQModel's defaults else.
    "demo-gptq-g32": dict(source="demo", tool="gptq", cfg=dict(bits=4, group_size=32)),
}
AWQ_NIBBLE = [0, 4, 1, 5, 2, 6, 3, 7]


def out_dir(name: str) -> Path:
    return mr.FIXTURES / ("prequant-" + name)


# ------------------------------------------------------------------------------------------------
# stage 1: GPTQModel
# ------------------------------------------------------------------------------------------------

def gptqmodel_qwen3vl_tree() -> None:
    from gptqmodel.models.definitions.base_qwen3_vl import BaseQwen3VLGPTQ
    BaseQwen3VLGPTQ.module_tree = ["model", "language_model", "layers", "#", {
        "input_layernorm": ("input_layernorm:!:norm",),
        "self_attn": ("q_norm:!:norm", "k_norm:!:norm", "q_proj:0:in=x", "k_proj:0:in=x",
                      "v_proj:0:in=x", "o_proj:1"),
        "post_attention_layernorm": ("post_attention_layernorm:!:norm",),
        "mlp": ("gate_proj:0:in=x", "up_proj:0:in=x", "down_proj:1")}]
    # (lm_head=True looks the final norm up by one name; the Qwen3-VL definition gives a list.)
    BaseQwen3VLGPTQ.pre_lm_head_norm_module = "model.language_model.norm"


def quantize(name: str, spec: dict) -> None:
    from gptqmodel import GPTQModel, QuantizeConfig
    gptqmodel_qwen3vl_tree()
    out = out_dir(name)
    if out.exists():
        shutil.rmtree(out)
    with tempfile.TemporaryDirectory() as tmp:
        # GPTQModel loads a Qwen3-VL's processor: the source with the demo model's files.
        src = Path(tmp) / "src"
        shutil.copytree(pr.source_dir(spec["source"]), src,
                        ignore=shutil.ignore_patterns("*.npy", "reference.json", "*.png"))
        for f in pr.DEMO_FILES:
            if not (src / f).exists():
                shutil.copyfile(pr.DEMO / f, src / f)
        cfg = dict(spec["cfg"])
        if spec["tool"] == "awq":
            cfg["method"] = "awq"
        qc = QuantizeConfig(**cfg, offload_to_disk=False)
        torch.manual_seed(0)
        model = GPTQModel.load(str(src), qc, device="cpu")
        g = torch.Generator().manual_seed(0)
        vocab = 300 if spec["source"] == "demo" else 1000
        calib = [{"input_ids": torch.randint(0, vocab, (64,), generator=g).tolist(),
                  "attention_mask": [1] * 64} for _ in range(16)]
        model.quantize(calib, batch_size=1)
        model.save(str(out))
    for junk in ("quant_log.csv", "quantize_config.json", "chat_template.jinja",
                 "processor_config.json"):
        (out / junk).unlink(missing_ok=True)
    meta = json.loads((out / "config.json").read_text())
    qcfg = meta["quantization_config"]
    if "meta" in qcfg:  # (the machine's temporary paths out)
        qcfg["meta"].pop("offload_to_disk_path", None)
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    for f in pr.DEMO_FILES:  # (GPTQModel's load reads the processor's files too)
        shutil.copyfile(pr.DEMO / f, out / f)
    diff = library_check(out, spec["tool"])
    if spec["source"] != "demo":
        for f in pr.DEMO_FILES:
            (out / f).unlink(missing_ok=True)
    import gptqmodel
    import transformers
    (out / "library_check.json").write_text(json.dumps(
        {"library_max_abs_diff": diff, "versions": {
            "gptqmodel": gptqmodel.__version__, "transformers": transformers.__version__,
            "torch": torch.__version__}}, indent=1) + "\n")
    print(f"{out.name}: quantized; GPTQModel's dequantization vs the script's: {diff}",
          flush=True)
    assert diff == 0.0, diff


def library_check(path: Path, tool: str) -> float:
    """GPTQModel's own f32 dequantization of every quantized weight against dequantize()'s."""
    from gptqmodel import BACKEND, GPTQModel
    deq, _ = dequantize(path)
    worst = 0.0
    if tool == "awq":
        from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm
        cfg = json.loads((path / "config.json").read_text())["quantization_config"]
        f = safe_open(path / "model.safetensors", "pt")
        for name in deq:
            base = name[: -len(".weight")]
            w = dequantize_gemm(f.get_tensor(base + ".qweight"), f.get_tensor(base + ".qzeros"),
                                f.get_tensor(base + ".scales").float(), 4, cfg["group_size"])
            worst = max(worst, float(np.abs(w.T.float().numpy() - deq[name]).max()))
        return worst
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    # (TorchLinear runs in f16 or bf16: its scales, f16 as stored, widened to f32 after the load.)
    model = GPTQModel.load(str(path), device="cpu", backend=BACKEND.GPTQ_TORCH,
                           dtype=torch.float16)
    seen = 0
    for name, mod in model.model.named_modules():
        if isinstance(mod, TorchLinear):
            mod.train(False)
            mod.scales.data = mod.scales.data.float()
            w = mod.dequantize_weight().detach().numpy().T  # [K, N] → [N, K]
            assert w.dtype == np.float32, w.dtype
            worst = max(worst, float(np.abs(w - deq[name + ".weight"]).max()))
            seen += 1
    assert seen == len(deq), (seen, len(deq))
    return worst


# ------------------------------------------------------------------------------------------------
# the dequantization (both stages)
# ------------------------------------------------------------------------------------------------

def unpack_cols(words: np.ndarray, bits: int) -> np.ndarray:
    """[R, C] uint32 words packed along R (value i at bits · i) → [R · 32/bits, C]."""
    per = 32 // bits
    out = np.zeros((words.shape[0] * per, words.shape[1]), np.int64)
    for i in range(per):
        out[i::per] = (words >> np.uint32(bits * i)) & np.uint32((1 << bits) - 1)
    return out


def dequantize(path: Path) -> tuple[dict, dict]:
    """(f32 [N, K] weights by tensor name, the other tensors as stored)."""
    cfg = json.loads((path / "config.json").read_text())["quantization_config"]
    awq = cfg["quant_method"] == "awq"
    v1 = not awq and cfg.get("checkpoint_format", "gptq") == "gptq"
    f = safe_open(path / "model.safetensors", "pt")
    names = set(f.keys())
    deq, plain = {}, {}
    for name in names:
        if name.endswith((".qzeros", ".scales", ".g_idx")):
            continue
        if not name.endswith(".qweight"):
            plain[name] = f.get_tensor(name)
            continue
        base = name[: -len(".qweight")]
        qw = f.get_tensor(name).numpy().view(np.uint32)
        qz = f.get_tensor(base + ".qzeros").numpy().view(np.uint32)
        s = f.get_tensor(base + ".scales").float().numpy()
        if awq:
            K, N = qw.shape[0], qw.shape[1] * 8
            q = np.zeros((K, N), np.int64)
            z = np.zeros((qz.shape[0], N), np.int64)
            for j in range(8):
                q[:, j::8] = (qw >> np.uint32(4 * AWQ_NIBBLE[j])) & np.uint32(15)
                z[:, j::8] = (qz >> np.uint32(4 * AWQ_NIBBLE[j])) & np.uint32(15)
            g = np.arange(K) // cfg["group_size"]
        else:
            bits = qw.shape[0] * 32 // f.get_tensor(base + ".g_idx").shape[0]
            if v1:
                add = 0x11111111 if bits == 4 else 0x01010101
                qz = ((qz.astype(np.uint64) + add) & 0xFFFFFFFF).astype(np.uint32)
            q = unpack_cols(qw, bits)
            z = unpack_cols(qz.T, bits).T
            g = f.get_tensor(base + ".g_idx").numpy().astype(np.int64)
        deq[base + ".weight"] = np.ascontiguousarray(
            ((q - z[g]).astype(np.float32) * s[g]).T)
    return deq, plain


# ------------------------------------------------------------------------------------------------
# stage 2: the reference
# ------------------------------------------------------------------------------------------------

def reference(name: str, spec: dict) -> None:
    out = out_dir(name)
    check = json.loads((out / "library_check.json").read_text())
    deq, plain = dequantize(out)
    model = pr.reference_model(dict(source=spec["source"]), deq, plain)
    ref = {"source": "models/tiny-qwen3vl" if spec["source"] == "demo"
           else pr.SOURCES[spec["source"]],
           "tool": "gptqmodel " + spec["tool"],
           "quantization_config": json.loads((out / "config.json").read_text())[
               "quantization_config"],
           "quantized_matrices": len(deq), "logits": [],
           "library_max_abs_diff": check["library_max_abs_diff"]}
    if spec["source"] == "demo":
        ref.update(pr.demo_answers(model))
        print(f"  transformers accuracy {ref['transformers_accuracy']:.2f}", flush=True)
    else:
        src_ref = json.loads((mr.FIXTURES / ref["source"] / "reference.json").read_text())
        for i, entry in enumerate(src_ref["logits"]):
            fname = f"logits_{i}.npy"
            np.save(out / fname, mr.forward_logits(model, entry["ids"]).astype(np.float32))
            ref["logits"].append({"ids": entry["ids"], "file": fname})
    import transformers
    ref["versions"] = dict(check["versions"], reference_transformers=transformers.__version__)
    ref["versions"]["torch"] = torch.__version__
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    (out / "library_check.json").unlink()
    print(f"{out.name}: {len(deq)} quantized matrices", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=None, choices=sorted(FIXTURES))
    ap.add_argument("--stage", choices=["quantize", "reference"], default="reference")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    import transformers
    five = int(transformers.__version__.split(".")[0]) >= 5
    for name, spec in FIXTURES.items():
        # Without --only, the reference stage makes the fixtures of the transformers line
        # installed (Qwen3.5's need 5.x, the others' 4.57.1).
        if (args.only and name not in args.only) or (
                not args.only and args.stage == "reference"
                and spec["source"].startswith("qwen35") != five):
            continue
        (quantize if args.stage == "quantize" else reference)(name, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
