#!/usr/bin/env python3
"""Build the mixture-of-experts reference fixtures (tests/model/fixtures/moe-*) with transformers.

Tiny random-weight ``Qwen3VLMoeForConditionalGeneration`` checkpoints, written by
``save_pretrained`` and recorded exactly as scripts/make_reference.py records the dense ones
(reference.json: "logits" over 1, 7 and 60 random ids, "greedy" continuations of 40 tokens), so
the dense model's tests (logits, greedy, INT8 / INT4 bounds) run on them unchanged. Several
expert counts, top-k and layer patterns:

* moe-f32-e8k2: 8 experts, top-2, layer 1 dense (``mlp_only_layers``); also an image case
  (a synthetic picture through the tiny vision tower and DeepStack): "image_cases".
* moe-f32-e16k4: 16 experts, top-4, ``decoder_sparse_step`` 2 (layers 1 and 3 sparse), untied
  head, rewritten after recording into one tensor per expert
  (``mlp.experts.{e}.{gate,up,down}_proj.weight``, the nn.Linear layout), the other layout vlm
  loads.
* moe-bf16-e4k1: BF16, 4 experts, top-1; the float32 run of the same weights is recorded too.
* moe-f32-tie: a planted router tie. Every router row is zero but two, +w for expert 3 and -w
  for expert 6, so in each row one of them leads and six experts tie at probability
  exp(0) / Σ for second place. vlm gives a tie at the k-th place to the lower index; torch.topk
  promises no order among equal values and on the CPU does not take the lower index. This
  fixture's reference is recorded with torch.topk replaced, in the modeling module only, by a
  stable descending sort (lower index first), and reference.json "stock_topk" records how many
  (layer, row) routings stock torch.topk chooses differently over the logits prompts.

Usage: python scripts/make_moe_reference.py [--only NAME ...]  (transformers 4.57.1, torch 2.9.0
on CPU; scripts/requirements-reference.txt). Deterministic; about a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen2VLImageProcessorFast
from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe

import make_reference as mr
import make_vision_reference as mv

# f32 greedy paths must not hinge on a near tie (vlm's sums differ in order: ~1e-6 relative).
MIN_MARGIN = 0.005

TEXT = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, rope_theta=1e6, mrope_section=[8, 4, 4])


def plant_tie(model) -> None:
    """Router rows: zero, except +w (expert 3) and -w (expert 6)."""
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is None:
                continue
            w = torch.randn(gate.weight.shape[1], generator=g) * 0.5
            gate.weight.zero_()
            gate.weight[3] = w
            gate.weight[6] = -w


CHECKPOINTS = {
    "moe-f32-e8k2": dict(text=dict(TEXT, num_hidden_layers=3, tie=True), dtype="float32",
                         ids="small", seed=7000, std=0.4, embed_std=0.2, min_margin=MIN_MARGIN,
                         moe=dict(num_experts=8, top_k=2, moe_intermediate_size=64,
                                  mlp_only_layers=[1]),
                         image=True),
    "moe-f32-e16k4": dict(text=dict(TEXT, num_hidden_layers=4, tie=False), dtype="float32",
                          ids="small", seed=7100, std=0.4, embed_std=0.2, min_margin=MIN_MARGIN,
                          moe=dict(num_experts=16, top_k=4, moe_intermediate_size=32,
                                   decoder_sparse_step=2),
                          layout="per_expert"),
    "moe-bf16-e4k1": dict(text=dict(TEXT, num_hidden_layers=2, tie=True), dtype="bfloat16",
                          ids="small", seed=7200, std=0.4, embed_std=0.2,
                          moe=dict(num_experts=4, top_k=1, moe_intermediate_size=64),
                          f32ref=True),
    "moe-f32-tie": dict(text=dict(TEXT, num_hidden_layers=2, tie=True), dtype="float32",
                        ids="small", seed=7300, std=0.4, embed_std=0.2, min_margin=MIN_MARGIN,
                        moe=dict(num_experts=8, top_k=2, moe_intermediate_size=32),
                        after_init=plant_tie, stable_topk=True),
}


def stable_topk(x, k, dim=-1, largest=True, sorted=True):  # noqa: A002 (torch's signature)
    assert largest and sorted
    v, i = torch.sort(x, dim=dim, descending=True, stable=True)
    return v.narrow(dim, 0, k), i.narrow(dim, 0, k)


class _TorchWithStableTopk:
    """torch, but topk is stable_topk: swapped into one MoE modeling module only."""

    topk = staticmethod(stable_topk)

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def stable_routing(on: bool, module=modeling_qwen3_vl_moe):
    """While on: torch.topk is stable_topk inside `module` (a modeling module; by default
    Qwen3-VL MoE's, make_qwen35_reference.py passes Qwen3.5 MoE's)."""
    if not on:
        yield
        return
    saved = module.torch
    module.torch = _TorchWithStableTopk()
    try:
        yield
    finally:
        module.torch = saved


def _router_probs(mod, inp, out) -> tuple:
    """Qwen3-VL MoE's router (transformers 4.57): its output is the logits."""
    return torch.softmax(out, dim=-1, dtype=torch.float), mod.top_k_for_check


@torch.no_grad()
def stock_topk_differences(model, prompts: list[list[int]], probs_of=_router_probs) -> dict:
    """Over the prompts' forward passes, the (layer, row) routings where stock torch.topk picks
    another expert set than the stable one, and how many rows tie at the k-th place. probs_of
    (router module, its input, its output) gives the routing probabilities and k (Qwen3.5 MoE's
    router returns the chosen experts instead: make_qwen35_reference.py passes its own)."""
    rows = differ = ties = 0
    hooks = []

    def hook(mod, inp, out):
        nonlocal rows, differ, ties
        p, k = probs_of(mod, inp, out)
        _, a = torch.topk(p, k, dim=-1)
        _, b = stable_topk(p, k)
        srt = torch.sort(p, dim=-1, descending=True).values
        rows += p.shape[0]
        ties += int((srt[:, k - 1] == srt[:, k]).sum())
        differ += int(sum(set(x) != set(y) for x, y in zip(a.tolist(), b.tolist())))

    for layer in model.model.language_model.layers:
        if hasattr(layer.mlp, "gate"):
            layer.mlp.gate.top_k_for_check = layer.mlp.top_k
            hooks.append(layer.mlp.gate.register_forward_hook(hook))
    try:
        for ids in prompts:
            mr.forward_logits(model, ids)
    finally:
        for h in hooks:
            h.remove()
    return {"routings": rows, "tied_at_kth_place": ties, "routed_differently": differ}


def add_image_case(name: str, spec: dict) -> None:
    """One image prompt: a synthetic 96x64 picture (written beside the checkpoint) between the
    vision specials, its logits and greedy continuation."""
    out = mr.FIXTURES / name
    mv.synthetic_image(96, 64, seed=3).save(out / "synthetic.png", format="PNG")
    proc = Qwen2VLImageProcessorFast(**mv.PROCESSOR)
    from PIL import Image
    with Image.open(out / "synthetic.png") as im:
        rgb = im.convert("RGB")
    min_pixels, max_pixels = mv.MIN_PIXELS, 48 * 32 * 32
    x = proc(images=[rgb], min_pixels=min_pixels, max_pixels=max_pixels, return_tensors="pt")
    grid = x["image_grid_thw"][0].tolist()
    ids = [mr.SMALL_IDS["vision_start"], mr.SMALL_IDS["image"], mr.SMALL_IDS["vision_end"]]
    prompt = [10, 13, 12] + [421, 77] + ids + [305, 611, 58] + [11, 12, 10, 14, 12]
    expanded = []
    for i in prompt:
        expanded += [i] * (grid[0] * grid[1] * grid[2] // 4) if i == mr.SMALL_IDS["image"] else [i]
    extra = dict(pixel_values=x["pixel_values"], image_grid_thw=torch.tensor([grid]))
    dtype = torch.bfloat16 if spec["dtype"] == "bfloat16" else torch.float32
    model = mr.load(out, dtype)
    with stable_routing(spec.get("stable_topk", False)):
        logits = mr.forward_logits(model, expanded, **extra)
        new, margins, mism = mr.greedy(model, expanded, mr.MAX_NEW_TOKENS, forbid=mv.VISION_IDS,
                                       **extra)
    assert mism == 0, mism
    np.save(out / "image_logits.npy", logits.astype(np.float32))
    ref = json.loads((out / "reference.json").read_text())
    ref["image_cases"] = [{
        "image": "synthetic.png", "min_pixels": min_pixels, "max_pixels": max_pixels,
        "image_grid_thw": grid, "prompt_ids": prompt, "input_ids": expanded,
        "logits": "image_logits.npy",
        "greedy": {"max_new_tokens": mr.MAX_NEW_TOKENS, "output_ids": new,
                   "margins": [round(m, 6) for m in margins]}}]
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(f"    image: grid {grid}, {len(expanded)} ids, greedy {new[:8]}..., min margin "
          f"{min(margins):.4g}", flush=True)


def split_experts(name: str) -> None:
    """Rewrites the fused expert tensors as one nn.Linear-layout tensor per expert."""
    path = mr.FIXTURES / name / "model.safetensors"
    tensors = load_file(path)
    out = {}
    for key, t in tensors.items():
        if key.endswith("mlp.experts.gate_up_proj"):
            base, inter = key[: -len("gate_up_proj")], t.shape[2] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :, :inter].T.contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, :, inter:].T.contiguous()
        elif key.endswith("mlp.experts.down_proj"):
            base = key[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].T.contiguous()
        else:
            out[key] = t
    save_file(out, path, metadata={"format": "pt"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=None, choices=sorted(CHECKPOINTS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    t0 = time.time()
    for name, spec in CHECKPOINTS.items():
        if args.only and name not in args.only:
            continue
        print(name, flush=True)
        with stable_routing(spec.get("stable_topk", False)):
            ref = mr.make_checkpoint(name, spec)
        if spec.get("stable_topk"):
            model = mr.load(mr.FIXTURES / name, torch.float32)
            ref["stock_topk"] = stock_topk_differences(model, [e["ids"] for e in ref["logits"]])
            print(f"    stock torch.topk: {ref['stock_topk']}", flush=True)
            assert ref["stock_topk"]["tied_at_kth_place"] > 0
            (mr.FIXTURES / name / "reference.json").write_text(json.dumps(ref, indent=1) + "\n",
                                                              encoding="utf-8")
        if spec.get("image"):
            add_image_case(name, spec)
        if spec.get("layout") == "per_expert":
            split_experts(name)
    print(f"done in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
