#!/usr/bin/env python3
"""Build the Qwen3.5 reference fixtures (tests/model/fixtures/qwen35-*) with transformers 5.x.

Tiny random-weight ``Qwen3_5ForConditionalGeneration`` checkpoints (model_type ``qwen3_5``: three
Gated DeltaNet linear-attention layers to each gated softmax-attention layer, zero-centred
RMSNorms, partial interleaved M-RoPE, a vision tower without DeepStack), written by
``save_pretrained`` with the tokenizer of models/tiny-qwen3vl (a 408-token byte-level BPE with
the Qwen specials, so the processor's "<t.t seconds>" video timestamps tokenize as in a real
checkpoint), and what transformers computes on them (CPU, float32, attn_implementation "eager",
the torch fallbacks of the delta rule: chunks of 64 for a prompt, the recurrent form while
generating):

* qwen35-f32-a: tied embeddings; 2 key and 2 value heads in the linear layers; built from
  ``full_attention_interval`` 4 (layers 0-2 linear, 3 full attention; save_pretrained writes it
  out as ``layer_types``); head_dim 32 with partial rotary factor 0.25 (8 rotary dims).
* qwen35-f32-b: untied head; 2 key and 4 value heads (each key head serves two value heads),
  key dim 16 and value dim 8; an explicit ``layer_types`` list (linear, full, linear, linear,
  full) and no ``full_attention_interval``; head_dim 16 with partial rotary factor 0.5.

And the mixtures of experts (``Qwen3_5MoeForConditionalGeneration``, model_type
``qwen3_5_moe``: every layer's MLP a routed mixture plus a shared expert scaled by
sigmoid(shared_expert_gate · x), the router always renormalising its top-k), each expert's
I and 2·I ≠ hidden, so a transposed load cannot pass the shape checks:

* qwen35moe-f32-a: the geometry of qwen35-f32-a (with images and a video); 8 experts, top-2,
  I = 96, shared expert 32; rewritten after recording into the fused expert tensors of the
  published checkpoints and of the model's own parameters (``mlp.experts.gate_up_proj``
  [E, 2·I, hidden], gate rows then up rows; ``mlp.experts.down_proj`` [E, hidden, I]).
  transformers loads both layouts: the script checks the rewritten file gives the same logits.
* qwen35moe-f32-b: the geometry of qwen35-f32-b but hidden 96; 12 experts, top-3, I = 32,
  shared expert 64 (every input dimension a multiple of 32: both fixtures run INT4);
  one tensor per expert (``mlp.experts.{e}.{gate,up,down}_proj.weight``), as save_pretrained
  writes them. Layer 0's router is planted with a tie:
  every row zero but +w for expert 3 and -w for expert 6, so in each token one of them leads
  and the zero-logit experts tie for the other places. vlm gives a tie to the lower index;
  torch.topk promises no order among equal values, so this fixture is recorded with torch.topk
  replaced, in the modeling module only, by a stable descending sort (lower index first);
  reference.json "stock_topk" records how many routings stock torch.topk chooses differently.

reference.json (per fixture), in the format of scripts/make_reference.py where it overlaps:
"logits" (prompts of 1, 7 and 150 random ids: the last crosses two 64-token chunks of the
chunked delta rule; every position's logits in <name>_logits_<i>.npy), "greedy" (40 tokens
after prompts of 5 and 70 ids, EOS disabled, with the top-1/top-2 margins and the
teacher-forced check), and "mm_cases" (qwen35-f32-a only): one image, two images, one video,
each with the processor's input_ids, grids, the full prefill logits and a 20-token greedy
continuation.

tests/data/tokenizer/corpus-qwen35.json: the strings of corpus-a.json (and a few more with
combining marks) encoded by the tests/data tokenizer with its split regex replaced by
transformers' Qwen3.5 one (tokenization_qwen3_5.PRETOKENIZE_REGEX, which adds \p{M} to the
letter runs), through the `tokenizers` library: vlm's tokenizer must give the same ids from the
same file.

Usage (a virtualenv outside the repository with scripts/requirements-reference-qwen35.txt):
    python scripts/make_qwen35_reference.py [--only NAME ...]     # a few minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import transformers
from safetensors.torch import load_file, save_file
from transformers import (Qwen2TokenizerFast, Qwen2VLImageProcessorFast, Qwen3_5Config,
                          Qwen3_5ForConditionalGeneration, Qwen3_5MoeConfig,
                          Qwen3_5MoeForConditionalGeneration)
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

import make_moe_reference as mm
import make_reference as mr
import make_video_reference as mvr

IDS = mvr.IDS
VISION_IDS = mvr.VISION_IDS
WORDS = (3, 400)  # random prompt ids: plain vocabulary, below the tiny tokenizer's specials
MIN_MARGIN = 0.005
MAX_SEED_TRIES = 200
NEW_TOKENS, MM_NEW_TOKENS = 40, 20

VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=16,
              temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
              hidden_act="gelu_pytorch_tanh", num_position_embeddings=64)

FIXTURES = {
    "qwen35-f32-a": dict(
        seed=100, mm=True, tie=True,
        text=dict(vocab_size=422, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
                  linear_value_head_dim=16, linear_conv_kernel_dim=4,
                  full_attention_interval=4,
                  rope_parameters=dict(rope_type="default", rope_theta=1e6,
                                       partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                                       mrope_interleaved=True))),
    "qwen35-f32-b": dict(
        seed=200, mm=False, tie=False,
        text=dict(vocab_size=422, hidden_size=64, intermediate_size=96, num_hidden_layers=5,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                  linear_value_head_dim=8, linear_conv_kernel_dim=4,
                  layer_types=["linear_attention", "full_attention", "linear_attention",
                               "linear_attention", "full_attention"],
                  rope_parameters=dict(rope_type="default", rope_theta=1e7,
                                       partial_rotary_factor=0.5, mrope_section=[2, 1, 1],
                                       mrope_interleaved=True))),
}
FIXTURES["qwen35moe-f32-a"] = dict(
    FIXTURES["qwen35-f32-a"], seed=300, layout="fused",
    text=dict(FIXTURES["qwen35-f32-a"]["text"], intermediate_size=None, num_experts=8,
              num_experts_per_tok=2, moe_intermediate_size=96,
              shared_expert_intermediate_size=32))
FIXTURES["qwen35moe-f32-b"] = dict(
    FIXTURES["qwen35-f32-b"], seed=400, tie_layer=0,
    text=dict(FIXTURES["qwen35-f32-b"]["text"], hidden_size=96, intermediate_size=None,
              num_experts=12, num_experts_per_tok=3, moe_intermediate_size=32,
              shared_expert_intermediate_size=64))

START, END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD = START + "<|image_pad|>" + END
MM_CASES = [
    dict(name="image", text=mvr.chat(IMAGE_PAD + "What colour is the square?"), images=1,
         videos=[]),
    dict(name="two_images", text=mvr.chat("Compare" + IMAGE_PAD + "and" + IMAGE_PAD + "now."),
         images=2, videos=[]),
    dict(name="video", text=mvr.chat(mvr.VIDEO + "Which way does it move?"), images=0,
         videos=["mp4_h264_2997.mp4"]),
]


def is_moe(spec: dict) -> bool:
    return "num_experts" in spec["text"]


def make_config(spec: dict) -> Qwen3_5Config:
    t = dict(spec["text"], hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6,
             attention_bias=False, tie_word_embeddings=spec["tie"], bos_token_id=IDS["bos"],
             eos_token_id=IDS["eos"])
    t = {k: v for k, v in t.items() if v is not None}
    cls = Qwen3_5MoeConfig if is_moe(spec) else Qwen3_5Config
    return cls(text_config=t, vision_config=dict(VISION, out_hidden_size=t["hidden_size"]),
               image_token_id=IDS["image"], video_token_id=IDS["video"],
               vision_start_token_id=IDS["vision_start"],
               vision_end_token_id=IDS["vision_end"], tie_word_embeddings=spec["tie"])


def model_class(spec: dict):
    return Qwen3_5MoeForConditionalGeneration if is_moe(spec) else Qwen3_5ForConditionalGeneration


@torch.no_grad()
def plant_tie(model, layer: int) -> None:
    """Layer `layer`'s router rows: zero, except +w (expert 3) and -w (expert 6)."""
    gate = model.model.language_model.layers[layer].mlp.gate
    w = torch.randn(gate.weight.shape[1], generator=torch.Generator().manual_seed(99)) * 0.5
    gate.weight.zero_()
    gate.weight[3] = w
    gate.weight[6] = -w


def router_probs(mod, inp, _out) -> tuple:
    """Qwen3_5MoeTopKRouter's routing probabilities (from its input: it returns the chosen
    experts) and k, for make_moe_reference.stock_topk_differences."""
    h = inp[0].reshape(-1, mod.hidden_dim)
    return (torch.softmax(torch.nn.functional.linear(h, mod.weight), dim=-1, dtype=torch.float),
            mod.top_k)


def fuse_experts(path: Path) -> None:
    """Rewrites the per-expert tensors save_pretrained writes as the fused ones ([E, 2·I, H]:
    gate rows then up rows; [E, H, I])."""
    tensors = load_file(path)
    out, experts = {}, {}
    for key, t in tensors.items():
        head, sep, tail = key.partition("mlp.experts.")
        if not sep:
            out[key] = t
            continue
        e, proj = tail.split(".")[:2]
        experts.setdefault(head + sep, {}).setdefault(proj, {})[int(e)] = t
    for base, projs in experts.items():
        n = len(projs["gate_proj"])
        out[base + "gate_up_proj"] = torch.stack(
            [torch.cat([projs["gate_proj"][e], projs["up_proj"][e]]) for e in range(n)])
        out[base + "down_proj"] = torch.stack([projs["down_proj"][e] for e in range(n)])
    save_file(out, path, metadata={"format": "pt"})


@torch.no_grad()
def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Deterministic init: N(0, 0.15) text matrices, N(0, 0.1) embeddings, N(0, 0.05) vision
    matrices; the zero-centred RMSNorms (scaled by 1 + w) N(0, 0.1), the gated norm and the
    vision LayerNorms 1 + N(0, 0.1); conv1d taps N(0, 0.3); A = exp(A_log) uniform in
    [0.02, 0.5] and dt_bias N(0, 0.5), so that the state decays over tens of tokens."""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if name.endswith("A_log"):
            val = torch.log(0.02 + 0.48 * torch.rand(p.shape, generator=g))
        elif name.endswith("dt_bias"):
            val = 0.5 * noise
        elif name.endswith("conv1d.weight"):
            val = 0.3 * noise
        elif "language_model" in name and mr.is_norm(name) and "linear_attn.norm" not in name:
            val = 0.1 * noise
        elif mr.is_norm(name):
            val = 1.0 + 0.1 * noise
        elif name.endswith(".bias"):
            val = 0.02 * noise
        elif "visual" in name:
            val = 0.05 * noise
        elif name.endswith("embed_tokens.weight"):
            val = 0.1 * noise
        else:
            val = 0.15 * noise
        p.copy_(val.to(p.dtype))


def build(spec: dict, seed: int, out: Path) -> None:
    torch.manual_seed(seed)
    model = model_class(spec)(make_config(spec))
    init_weights(model, seed)
    if "tie_layer" in spec:
        plant_tie(model, spec["tie_layer"])
    if spec["tie"]:
        assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=IDS["bos"], eos_token_id=IDS["eos"], pad_token_id=IDS["pad"],
        do_sample=False)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)


def load(out: Path, spec: dict):
    model = model_class(spec).from_pretrained(out, dtype=torch.float32,
                                              attn_implementation="eager")
    model.eval()
    return model


def processor():
    tok = Qwen2TokenizerFast.from_pretrained(str(mvr.TINY))
    strip = lambda c: {k: v for k, v in c.items() if not k.endswith("_type")  # noqa: E731
                       and k != "processor_class"}
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessorFast(**strip(mvr.IMAGE_CONFIG)),
                            video_processor=Qwen3VLVideoProcessor(**strip(mvr.VIDEO_CONFIG)),
                            tokenizer=tok), tok


def mm_inputs(proc, case: dict, clips: dict) -> dict:
    c = dict(case, videos=case["videos"], images=[mvr.IMAGE.name] * case["images"])
    if not case["videos"]:
        images = [Image.open(mvr.IMAGE).convert("RGB") for _ in range(case["images"])]
        return proc(text=[case["text"]], images=images, return_tensors="pt")
    return mvr.processor_inputs(proc, c, clips)


_forward_logits = mr.forward_logits


def forward_logits(model, ids: list[int], **extra):
    """mr.forward_logits with the processor's mm_token_type_ids (text 0, image 1, video 2)
    extended by text over generated ids (mr.greedy's teacher-forced check passes prompt +
    output)."""
    t = extra.get("mm_token_type_ids")
    if t is not None and t.shape[1] < len(ids):
        pad = torch.zeros((1, len(ids) - t.shape[1]), dtype=t.dtype)
        extra = dict(extra, mm_token_type_ids=torch.cat([t, pad], dim=1))
    return _forward_logits(model, ids, **extra)


mr.forward_logits = forward_logits


def extra_of(enc) -> dict:
    return {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask")}


def good(r) -> bool:
    new, margins, mismatches = r
    return mismatches == 0 and mr.diverse(new) and min(margins) >= MIN_MARGIN


def make_fixture(name: str, spec: dict, proc, clips: dict) -> None:
    out = mr.FIXTURES / name
    rng = np.random.default_rng(spec["seed"])
    prompt = lambda n: rng.integers(*WORDS, size=n).tolist()  # noqa: E731
    logit_prompts = [prompt(1), prompt(7), prompt(150)]
    greedy_prompts = [prompt(5), prompt(70)]
    encs = [mm_inputs(proc, c, clips) for c in MM_CASES] if spec["mm"] else []

    ckpt = Path(tempfile.mkdtemp(prefix=name + "-")) / "ckpt"
    chosen = None
    for attempt in range(MAX_SEED_TRIES):
        seed = spec["seed"] + attempt
        build(spec, seed, ckpt)
        model = load(ckpt, spec)
        results = []
        for p in greedy_prompts:
            results.append(mr.greedy(model, p, NEW_TOKENS))
            if not good(results[-1]):
                break
        mm_results = []
        if all(good(r) for r in results) and len(results) == len(greedy_prompts):
            for enc in encs:
                mm_results.append(mr.greedy(model, enc["input_ids"][0].tolist(), MM_NEW_TOKENS,
                                            forbid=VISION_IDS, **extra_of(enc)))
                if not good(mm_results[-1]):
                    break
        ok = (len(results) == len(greedy_prompts) and all(good(r) for r in results)
              and len(mm_results) == len(encs) and all(good(r) for r in mm_results))
        print(f"  {name}: seed {seed}: {'ok' if ok else 'retry'}", flush=True)
        if ok:
            chosen = (seed, model, results, mm_results)
            break
    if chosen is None:
        raise SystemExit(f"{name}: no seed passes")
    seed, model, results, mm_results = chosen
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in sorted(ckpt.iterdir()):
        shutil.move(str(f), out / f.name)
    shutil.rmtree(ckpt.parent)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(mvr.TINY / f, out / f)
    if spec["mm"]:
        (out / "preprocessor_config.json").write_text(json.dumps(mvr.IMAGE_CONFIG, indent=2) + "\n")
        (out / "video_preprocessor_config.json").write_text(
            json.dumps(mvr.VIDEO_CONFIG, indent=2) + "\n")

    ref = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "dtype": "float32", "attn_implementation": "eager", "seed": seed,
           "greedy_note": "pure argmax, EOS disabled; margins[i] = top1 - top2 logit at step i",
           "logits": [], "greedy": [], "mm_cases": []}
    for i, ids in enumerate(logit_prompts):
        f = f"logits_{i}.npy"
        np.save(out / f, mr.forward_logits(model, ids).astype(np.float32))
        ref["logits"].append({"ids": ids, "file": f})
    for ids, (new, margins, mismatches) in zip(greedy_prompts, results):
        ref["greedy"].append({"prompt_ids": ids, "max_new_tokens": NEW_TOKENS, "output_ids": new,
                              "margins": [round(m, 6) for m in margins],
                              "teacher_forced_mismatches": mismatches})
    for case, enc, (new, margins, _) in zip(MM_CASES, encs, mm_results):
        ids = enc["input_ids"][0].tolist()
        f = f"{case['name']}_logits.npy"
        np.save(out / f, mr.forward_logits(model, ids, **extra_of(enc)).astype(np.float32))
        entry = dict(name=case["name"], text=case["text"], images=[mvr.IMAGE.name] * case["images"],
                     videos=case["videos"], input_ids=ids, greedy=new,
                     margins=[round(m, 6) for m in margins], logits=f)
        for k in ("image_grid_thw", "video_grid_thw"):
            if k in enc:
                entry[k] = enc[k].tolist()
        ref["mm_cases"].append(entry)
        print(f"  {name} {case['name']}: {len(ids)} ids, greedy {new[:8]}...", flush=True)
    if "tie_layer" in spec:
        for layer in model.model.language_model.layers:
            layer.mlp.top_k = layer.mlp.gate.top_k  # where stock_topk_differences looks
        ref["stock_topk"] = mm.stock_topk_differences(model, logit_prompts, router_probs)
        print(f"  {name}: stock torch.topk: {ref['stock_topk']}", flush=True)
        assert ref["stock_topk"]["tied_at_kth_place"] > 0
    if spec.get("layout") == "fused":
        fuse_experts(out / "model.safetensors")
        again = load(out, spec)
        for ids, e in zip(logit_prompts, ref["logits"]):
            assert np.array_equal(mr.forward_logits(again, ids), np.load(out / e["file"])), name
        print(f"  {name}: rewritten with fused experts; transformers loads it the same",
              flush=True)
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


# Strings whose split changes with \p{M}: letters followed by combining marks.
MARK_CASES = ["नमस्ते दुनिया", "สวัสดีครับ", "cafe\u0301 de\u0301ja\u0300 vu", "Z\u0351a\u0328lgo\u0300!",
              "ﬁ ǆ e\u0308\u0301x", "क्षत्रिय 123 ज्ञान"]


def write_pretokenizer_corpus() -> None:
    from tokenizers import Tokenizer
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX
    data = json.loads(mr.TOKENIZER_JSON.read_text(encoding="utf-8"))
    split = data["pre_tokenizer"]["pretokenizers"][0]
    assert split["type"] == "Split", split
    old = split["pattern"]["Regex"]
    split["pattern"]["Regex"] = PRETOKENIZE_REGEX
    tok = Tokenizer.from_str(json.dumps(data))
    qwen3 = Tokenizer.from_file(str(mr.TOKENIZER_JSON))
    corpus = json.loads((mr.TESTDATA / "tokenizer" / "corpus-a.json").read_text(encoding="utf-8"))
    texts = [c["text"] for c in corpus] + MARK_CASES
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]
    differ = sum(int(c["ids"] != qwen3.encode(c["text"], add_special_tokens=False).ids)
                 for c in cases)
    out = {"regex": PRETOKENIZE_REGEX, "replaces": old, "differ_from_qwen3": differ,
           "cases": cases}
    (mr.TESTDATA / "tokenizer" / "corpus-qwen35.json").write_text(
        json.dumps(out, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"  corpus-qwen35.json: {len(cases)} strings, {differ} split differently from Qwen3")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=None, choices=sorted(FIXTURES))
    args = ap.parse_args()
    if not args.only:
        write_pretokenizer_corpus()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    clips = json.loads((mvr.VIDEOS / "reference.json").read_text())["clips"]
    proc, _ = processor()
    for name, spec in FIXTURES.items():
        if args.only and name not in args.only:
            continue
        with mm.stable_routing("tie_layer" in spec, modeling_qwen3_5_moe):
            make_fixture(name, spec, proc, clips)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
