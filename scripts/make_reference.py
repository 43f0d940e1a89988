#!/usr/bin/env python3
"""Build the reference fixtures in tests/model/fixtures/ with Hugging Face transformers.

What it writes (all on CPU, deterministic for a given transformers/torch version):

* Tiny random-weight ``Qwen3VLForConditionalGeneration`` checkpoints, one folder each
  (config.json, generation_config.json, model.safetensors written by ``save_pretrained``)
  plus ``reference.json`` and ``logits_*.npy`` recorded with transformers
  (attn_implementation="eager"):
    - logits: a plain forward over the whole id sequence, float32 [len(ids), vocab];
    - greedy: ``model.generate(do_sample=False)`` with EOS disabled, so exactly
      ``max_new_tokens`` tokens of pure argmax decoding come out (see GREEDY below).
* Chat-template fixtures (chat_template/cases.json): conversations rendered by
  ``PreTrainedTokenizerFast.apply_chat_template(tokenize=False)`` with the Qwen3-VL Instruct
  template stored in chat_template/chat_template.jinja.

Usage:
    python scripts/make_reference.py            # everything
    python scripts/make_reference.py --only chat
    python scripts/make_reference.py --only text-f32-untied

Nothing is downloaded: configs are built in code, the tokenizer comes from
tests/data/tokenizer/tokenizer.json.

The image-prompt checkpoint (tests/model/fixtures/vision-f32) is built by
scripts/make_vision_reference.py, which imports the helpers below.

GREEDY: transformers' ``min_new_tokens`` works by masking the EOS logits, which would make the
reference differ from a plain argmax whenever EOS happens to win.  Instead the EOS ids are
removed from the generation config for the reference run (the saved generation_config.json keeps
them), so every recorded step is the argmax of the full logits row.  A consumer must therefore
not stop at EOS when replaying these prompts.  Each step's top-1 minus top-2 logit gap is
recorded as ``margins`` so a test can tell a genuine bug from a near tie.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

import transformers
from transformers import (GenerationConfig, PreTrainedTokenizerFast, Qwen3VLConfig,
                          Qwen3VLForConditionalGeneration, Qwen3VLMoeConfig,
                          Qwen3VLMoeForConditionalGeneration)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "model" / "fixtures"
TESTDATA = REPO / "tests" / "data"
TOKENIZER_JSON = TESTDATA / "tokenizer" / "tokenizer.json"
CHAT_DIR = FIXTURES / "chat_template"
TEMPLATE_PATH = CHAT_DIR / "chat_template.jinja"

# Real Qwen3 / Qwen3-VL special ids (tests/data/tokenizer/README.md).
QWEN_IDS = dict(bos=151643, eos=[151645, 151643], pad=151643, image=151655, video=151656,
                vision_start=151652, vision_end=151653)
# Small-vocabulary checkpoints: ids 0..2 are pad/bos/eos, 1000..1003 the vision specials,
# random prompts use ids in [3, 1000).
SMALL_IDS = dict(bos=1, eos=[2], pad=0, image=1000, video=1001, vision_start=1002,
                 vision_end=1003)
PROMPT_ID_RANGE = (3, 1000)

# Tiny vision tower (only the text decoder is exercised for now).  hidden 16 rather than 32
# keeps the four checkpoints under the 20 MB fixture budget: the merger and the two DeepStack
# mergers are [out_hidden, 4*hidden] each, so the vision width dominates their size.
TINY_VISION = dict(depth=2, hidden_size=16, num_heads=2, intermediate_size=32, patch_size=16,
                   temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                   hidden_act="gelu_pytorch_tanh", num_position_embeddings=64,
                   deepstack_visual_indexes=[0, 1])

# hidden 128 with 4 heads x head_dim 128: q_proj is [512, 128] and o_proj [128, 512], so the
# attention width differs from the hidden size as in the real 4B model (q 4096, hidden 2560).
# The small hidden size also keeps all fixtures under the 20 MB budget.
HD128_TEXT = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=128, rope_theta=5e6,
                  mrope_section=[24, 20, 20], tie=True)

CHECKPOINTS = {
    # hd128: with hidden 128 and the tied head, N(0, 0.1) matrices leave the residual stream
    # dominated by the input embedding and greedy decoding repeats the last token; matrices at
    # 0.2 (embedding 0.1) give diverse, mostly tie-free paths.
    "text-f32-hd128-tied": dict(text=HD128_TEXT, dtype="float32", ids="small", seed=1000,
                                std=0.2, embed_std=0.1),
    "text-f32-untied": dict(text=dict(vocab_size=1024, hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=32, rope_theta=1e6,
                                      mrope_section=[8, 4, 4], tie=False),
                            dtype="float32", ids="small", seed=2000, std=0.1),
    "text-bf16-hd128": dict(text=HD128_TEXT, dtype="bfloat16", ids="small", seed=3000, std=0.2,
                            embed_std=0.1, f32ref=True),
    "tiny-fullvocab-bf16": dict(text=dict(vocab_size=151936, hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=1, head_dim=16, rope_theta=5e6,
                                          mrope_section=[4, 2, 2], tie=True),
                                # 151936 candidates in 16 dims: bf16 logits tie often and
                                # greedy paths fall into runs; a small embedding std (the
                                # embedding is also the LM head) and a seed search started
                                # at 6150 give a diverse, tie-free path.
                                dtype="bfloat16", ids="qwen", seed=6150, std=0.3,
                                embed_std=0.1,
                                # vlm computes in f32: its greedy path must equal transformers'
                                # f32 run of these bf16 weights (margins here are one bf16 ulp).
                                # No f32ref logits: a 151936-wide row is 0.6 MB of budget.
                                f32ref=True, f32ref_logits=False),
}

MAX_NEW_TOKENS = 40
MAX_SEED_TRIES = 200


# ----------------------------------------------------------------------------------------------
# checkpoints
# ----------------------------------------------------------------------------------------------

def make_config(spec: dict) -> Qwen3VLConfig:
    t = spec["text"]
    ids = QWEN_IDS if spec["ids"] == "qwen" else SMALL_IDS
    assert sum(t["mrope_section"]) * 2 == t["head_dim"], "mrope_section must sum to head_dim/2"
    text_config = dict(
        vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
        intermediate_size=t["intermediate_size"], num_hidden_layers=t["num_hidden_layers"],
        num_attention_heads=t["num_attention_heads"],
        num_key_value_heads=t["num_key_value_heads"], head_dim=t["head_dim"],
        hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_theta=t["rope_theta"], attention_bias=False, attention_dropout=0.0,
        rope_scaling={"rope_type": "default", "mrope_section": list(t["mrope_section"]),
                      "mrope_interleaved": True},
        tie_word_embeddings=t["tie"], bos_token_id=ids["bos"], eos_token_id=ids["eos"][0],
        initializer_range=0.02, use_cache=True)
    vision_config = dict(spec.get("vision", TINY_VISION), out_hidden_size=t["hidden_size"],
                         initializer_range=0.02)
    config_cls = Qwen3VLConfig
    if "moe" in spec:  # a Qwen3VLMoeConfig: the sparse MLP's fields join the text config
        m = spec["moe"]
        text_config.update(num_experts=m["num_experts"], num_experts_per_tok=m["top_k"],
                           moe_intermediate_size=m["moe_intermediate_size"],
                           decoder_sparse_step=m.get("decoder_sparse_step", 1),
                           mlp_only_layers=list(m.get("mlp_only_layers", [])),
                           norm_topk_prob=True)
        config_cls = Qwen3VLMoeConfig
    cfg = config_cls(text_config=text_config, vision_config=vision_config,
                     image_token_id=ids["image"], video_token_id=ids["video"],
                     vision_start_token_id=ids["vision_start"],
                     vision_end_token_id=ids["vision_end"], tie_word_embeddings=t["tie"])
    return cfg


def is_norm(name: str) -> bool:
    # RMSNorm / LayerNorm weights: input_layernorm, post_attention_layernorm, q_norm, k_norm,
    # language_model.norm, visual blocks norm1/norm2, merger norms.
    parts = name.split(".")
    return parts[-1] == "weight" and "norm" in parts[-2]


@torch.no_grad()
def init_weights(model: torch.nn.Module, seed: int, std: float,
                 embed_std: float | None = None, vision_std: float = 0.05,
                 pos_embed_std: float | None = None) -> None:
    """Deterministic init: N(0, std) for text matrices and embeddings (N(0, embed_std) for the
    embeddings when given), N(0, vision_std) for vision matrices (N(0, pos_embed_std) for the
    vision position-embedding table when given), 1 + N(0, 0.1) for norm weights, N(0, 0.02)
    for biases."""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):  # tied: listed once
        noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if is_norm(name):
            val = 1.0 + 0.1 * noise
        elif name.endswith(".bias"):
            val = 0.02 * noise
        elif name.endswith("visual.pos_embed.weight") and pos_embed_std is not None:
            val = pos_embed_std * noise
        elif ".visual." in name or name.startswith("model.visual"):
            val = vision_std * noise
        elif name.endswith("embed_tokens.weight") and embed_std is not None:
            val = embed_std * noise
        else:
            val = std * noise
        p.copy_(val.to(p.dtype))


def generation_config_for(spec: dict) -> GenerationConfig:
    ids = QWEN_IDS if spec["ids"] == "qwen" else SMALL_IDS
    eos = ids["eos"] if len(ids["eos"]) > 1 else ids["eos"][0]
    return GenerationConfig(bos_token_id=ids["bos"], eos_token_id=eos, pad_token_id=ids["pad"],
                            do_sample=False)


def build_and_save(name: str, spec: dict, seed: int, out: Path) -> None:
    cfg = make_config(spec)
    torch.manual_seed(seed)
    model = (Qwen3VLMoeForConditionalGeneration if "moe" in spec
             else Qwen3VLForConditionalGeneration)(cfg)
    init_weights(model, seed, spec["std"], spec.get("embed_std"), spec.get("vision_std", 0.05),
                 spec.get("pos_embed_std"))
    if "after_init" in spec:
        spec["after_init"](model)
    if spec["text"]["tie"]:
        assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    if spec["dtype"] == "bfloat16":
        model = model.to(torch.bfloat16)
    model.generation_config = generation_config_for(spec)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)


def load(out: Path, dtype: torch.dtype):
    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    cls = {c.__name__: c for c in (Qwen3VLForConditionalGeneration,
                                   Qwen3VLMoeForConditionalGeneration)}[arch]
    model = cls.from_pretrained(out, dtype=dtype, attn_implementation="eager")
    model.eval()
    assert model.config._attn_implementation == "eager"
    assert model.config.text_config._attn_implementation == "eager"
    return model


@torch.no_grad()
def forward_logits(model, ids: list[int], **extra) -> np.ndarray:
    """One plain forward over ids; extra model inputs (pixel_values, image_grid_thw) pass
    through."""
    x = torch.tensor([ids], dtype=torch.long)
    out = model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False, **extra)
    return out.logits[0].float().numpy()


@torch.no_grad()
def greedy(model, ids: list[int], n: int, forbid: frozenset = frozenset(),
           **extra) -> tuple[list[int], list[float], int | None]:
    """Pure argmax decoding of n tokens via model.generate (EOS disabled).  Returns the new ids,
    the top1-top2 gap at each step, and how many steps disagree with a teacher-forced full
    forward (0 expected in float32; a near tie can flip in bfloat16).  Extra model inputs
    (pixel_values, image_grid_thw) pass through.  If an id in forbid was generated, the
    teacher-forced check is skipped and None returned in its place (an image pad in the output
    would make the full forward fail)."""
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = None
    gc.do_sample = False
    gc.max_new_tokens = n
    gc.min_new_tokens = None
    gc.temperature = None
    gc.top_p = None
    gc.top_k = None
    saved = model.generation_config
    model.generation_config = gc  # otherwise generate() refills eos from the model's config
    try:
        x = torch.tensor([ids], dtype=torch.long)
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gc,
                             output_scores=True, return_dict_in_generate=True, **extra)
    finally:
        model.generation_config = saved
    new = out.sequences[0, len(ids):].tolist()
    assert len(new) == n, (len(new), n)
    margins = []
    for step, s in enumerate(out.scores):
        row = s[0].float()
        top2 = torch.topk(row, 2).values
        assert int(row.argmax()) == new[step]
        margins.append(float(top2[0] - top2[1]))
    if forbid & set(new):
        return new, margins, None
    full = forward_logits(model, ids + new, **extra)
    tf = full[len(ids) - 1:-1].argmax(-1).tolist()
    mismatches = sum(int(a != b) for a, b in zip(tf, new))
    return new, margins, mismatches


def diverse(seq: list[int]) -> bool:
    """Not a degenerate loop: many distinct tokens overall and in the tail, and no token
    repeated more than 3 times in a row."""
    longest, run = 1, 1
    for a, b in zip(seq, seq[1:]):
        run = run + 1 if a == b else 1
        longest = max(longest, run)
    return len(set(seq)) >= 12 and len(set(seq[-16:])) >= 6 and longest <= 3


def random_prompt(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(PROMPT_ID_RANGE[0], PROMPT_ID_RANGE[1], size=n).tolist()


def chat_prompts() -> list[dict]:
    """Chat-formatted prompts for the full-vocabulary model: text rendered with the Qwen3-VL
    template, ids from the real tokenizer.json via `tokenizers`."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(TOKENIZER_JSON))
    ptf = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_JSON))
    template = TEMPLATE_PATH.read_text(encoding="utf-8")
    convs = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "Write a haiku about the sea."}],
    ]
    res = []
    for conv in convs:
        text = ptf.apply_chat_template(conv, chat_template=template, tokenize=False,
                                       add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False).ids
        res.append({"text": text, "ids": ids})
    return res


def make_checkpoint(name: str, spec: dict) -> dict:
    out = FIXTURES / name
    dtype = torch.bfloat16 if spec["dtype"] == "bfloat16" else torch.float32
    rng = np.random.default_rng(spec["seed"])
    if spec["ids"] == "qwen":
        chats = chat_prompts()
        # One 1-token prompt only: each row is 151936 floats (0.6 MB), the fixture budget is 20 MB.
        logit_prompts = [chats[0]["ids"][:1]]
        greedy_prompts = [c["ids"] for c in chats]
        greedy_texts = [c["text"] for c in chats]
    else:
        logit_prompts = [random_prompt(rng, 1), random_prompt(rng, 7), random_prompt(rng, 60)]
        greedy_prompts = [random_prompt(rng, 5), random_prompt(rng, 12)]
        greedy_texts = [None, None]

    chosen = None
    for attempt in range(MAX_SEED_TRIES):
        seed = spec["seed"] + attempt
        build_and_save(name, spec, seed, out)
        model = load(out, dtype)
        results, ok = [], True
        for p in greedy_prompts:  # stop at the first prompt that fails
            r = greedy(model, p, MAX_NEW_TOKENS)
            results.append(r)
            ok = diverse(r[0]) and min(r[1]) >= spec.get("min_margin", 0)
            if spec["dtype"] == "bfloat16":
                # bf16 logits tie easily (8-bit mantissa); keep seeds whose greedy path has no
                # exact tie (in its first tie_free_steps steps), so the recorded argmax does not
                # hinge on tie-breaking.
                ok = ok and min(r[1][:spec.get("tie_free_steps", MAX_NEW_TOKENS)]) > 0
            if not ok:
                break
        print(f"  {name}: seed {seed}: distinct {[len(set(r[0])) for r in results]}, min margin "
              f"{[round(min(r[1]), 4) for r in results]} -> {'ok' if ok else 'retry'}",
              flush=True)
        if ok:
            chosen = (seed, model, results)
            break
    if chosen is None:
        raise SystemExit(f"{name}: no seed in {MAX_SEED_TRIES} tries gives diverse greedy output")
    seed, model, results = chosen

    ref = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "dtype": spec["dtype"],
        "attn_implementation": "eager",
        "seed": seed,
        "init": {"text_std": spec["std"], "embed_std": spec.get("embed_std", spec["std"]),
                 "vision_std": 0.05, "norm": "1 + N(0, 0.1^2)", "bias_std": 0.02},
        "greedy_note": ("pure argmax: EOS disabled during generate(), so do not stop at EOS; "
                        "margins[i] = top1 - top2 logit at step i"),
        "logits": [],
        "greedy": [],
    }
    ref_model = load(out, torch.float32) if spec.get("f32ref") else None
    for i, ids in enumerate(logit_prompts):
        fname = f"logits_{i}.npy"
        np.save(out / fname, forward_logits(model, ids).astype(np.float32))
        entry = {"ids": ids, "file": fname}
        if ref_model is not None and spec.get("f32ref_logits", True):
            f32name = f"logits_f32ref_{i}.npy"
            np.save(out / f32name, forward_logits(ref_model, ids).astype(np.float32))
            entry["file_f32ref"] = f32name
        ref["logits"].append(entry)
    for ids, text, (new, margins, mism) in zip(greedy_prompts, greedy_texts, results):
        entry = {"prompt_ids": ids, "max_new_tokens": MAX_NEW_TOKENS, "output_ids": new,
                 "margins": [round(m, 6) for m in margins],
                 "teacher_forced_mismatches": mism}
        if text is not None:
            entry["prompt_text"] = text
        if ref_model is not None:
            new32, margins32, _ = greedy(ref_model, ids, MAX_NEW_TOKENS)
            entry["output_ids_f32ref"] = new32
            entry["margins_f32ref"] = [round(m, 6) for m in margins32]
        ref["greedy"].append(entry)
        print(f"    greedy {len(ids)} -> {new[:12]}... min margin {min(margins):.4g}, "
              f"teacher-forced mismatches {mism}", flush=True)
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    return ref


# ----------------------------------------------------------------------------------------------
# chat template
# ----------------------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city (température, °C)",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {"type": "object",
                       "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]},
    },
}


def chat_cases() -> list[dict]:
    img = {"type": "image"}
    img_file = {"type": "image", "image": "file.jpg"}
    vid = {"type": "video"}

    def txt(s):
        return {"type": "text", "text": s}

    def case(name, messages, agp=True, vision_id=False, tools=None):
        c = {"name": name, "messages": messages, "add_generation_prompt": agp,
             "add_vision_id": vision_id}
        if tools is not None:
            c["tools"] = tools
        return c

    U = lambda content: {"role": "user", "content": content}  # noqa: E731
    A = lambda content, **kw: dict({"role": "assistant", "content": content}, **kw)  # noqa: E731
    S = lambda content: {"role": "system", "content": content}  # noqa: E731
    T = lambda content: {"role": "tool", "content": content}  # noqa: E731

    return [
        case("user_string", [U("Hello!")]),
        case("user_string_no_generation_prompt", [U("Hello!")], agp=False),
        case("system_string", [S("You are a helpful assistant."), U("Hi there.")]),
        case("system_list_parts", [S([txt("You are terse. "), img, txt("Answer in English.")]),
                                   U("Why is the sky blue?")]),
        case("user_list_text_only", [U([txt("first part, "), txt("second part")])]),
        case("user_image_text", [U([img, txt("Describe this image.")])]),
        case("user_text_image", [U([txt("What is in this picture?"), img_file])]),
        case("user_two_images", [U([img, img, txt("Compare these two images.")])]),
        case("user_video", [U([vid, txt("What happens in this video?")])]),
        case("user_images_video_vision_id", [U([img, txt("and"), img_file, vid,
                                                txt("Describe all of them.")])],
             vision_id=True),
        case("multi_turn_vision_id_counts_across_turns",
             [U([img, txt("What is this?")]), A("A cat."),
              U([img, vid, txt("And these?")])], vision_id=True),
        case("multi_turn_string", [S("Be brief."), U("Hi"), A("Hello! How can I help?"),
                                   U("Tell me a joke.")]),
        case("multi_turn_no_generation_prompt", [U("Hi"), A("Hello!")], agp=False),
        case("assistant_list_content", [U([img, txt("Caption?")]),
                                        A([txt("A red "), txt("bicycle.")]), U("Thanks")]),
        case("unicode", [S("Réponds en français. 你好 🙂"),
                         U("Qu'est-ce que «ça»? 一只猫在沙发上 👩‍👩‍👧 naïve café"),
                         A("C'est ça — 猫. ✅"), U("Ünïcödé ∑ ∫ ≠ \u00a0nbsp")]),
        case("empty_user_content", [U("")]),
        case("empty_assistant_content", [U("Say nothing."), A(""), U("Ok.")]),
        case("empty_user_list", [U([])]),
        case("newlines_and_literal_special_tokens",
             [U("line1\nline2\n\n  indented\t<tab>\nliteral <|im_end|> and <think>x</think>")]),
        case("late_system_message_is_dropped",
             [U("Hi"), A("Hello."), S("Late system text."), U("Again")]),
        case("tools_with_system",
             [S("You are a weather bot."), U("Weather in Paris?"),
              A("Let me check.",
                tool_calls=[{"type": "function",
                             "function": {"name": "get_weather",
                                          "arguments": {"city": "Paris", "unit": "celsius"}}}]),
              T("18 degrees, sunny"), U("Thanks!")],
             tools=[WEATHER_TOOL]),
        case("tools_without_system", [U("Add 2 and 3.")], tools=[ADD_TOOL, WEATHER_TOOL]),
        case("tool_calls_no_content_two_calls_string_args",
             [U("Compute things."),
              A("", tool_calls=[
                  {"type": "function", "function": {"name": "add",
                                                    "arguments": "{\"a\": 2, \"b\": 3}"}},
                  {"type": "function", "function": {"name": "add",
                                                    "arguments": {"a": 10, "b": -4}}}]),
              T("5"), T("6")],
             tools=[ADD_TOOL]),
        case("tool_call_without_function_wrapper_and_list_system",
             [S([txt("System as parts.")]), U("Go"),
              A("Calling.", tool_calls=[{"name": "add", "arguments": {"a": 1, "b": 1}}]),
              T("2")],
             agp=False, tools=[ADD_TOOL]),
        case("tool_response_with_image_list_content",
             [U([img, txt("Crop it.")]),
              A("", tool_calls=[{"type": "function",
                                 "function": {"name": "crop", "arguments": {"box": [1, 2, 3, 4]}}}]),
              T([txt("Here is the crop:"), img])],
             vision_id=True),
        case("tool_calls_without_tools_list",
             [U("Weather?"),
              A("Checking.", tool_calls=[{"type": "function",
                                          "function": {"name": "get_weather",
                                                       "arguments": {"city": "Oslo"}}}]),
              T("-3 °C, snow")]),
    ]


# Independent cross-check: exact strings from ollama/ollama
# model/renderers/qwen3vl_nonthinking_test.go (a hand-written renderer tested against the real
# template).  Only cases whose semantics are the same as HF's apply_chat_template are used.
OLLAMA_CHECKS = [
    ([{"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "Hello, how are you?"}], True,
     "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
     "Hello, how are you?<|im_end|>\n<|im_start|>assistant\n"),
    ([{"role": "user", "content": "Compute results"},
      {"role": "assistant", "content": "ok",
       "tool_calls": [{"function": {"name": "job", "arguments": {"n": 1}}}]},
      {"role": "tool", "content": "5"}, {"role": "tool", "content": "6"}], True,
     "<|im_start|>user\nCompute results<|im_end|>\n<|im_start|>assistant\nok\n<tool_call>\n"
     "{\"name\": \"job\", \"arguments\": {\"n\": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n"
     "<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response><|im_end|>\n"
     "<|im_start|>assistant\n"),
    ([{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                   {"type": "text", "text": "Describe."}]}], True,
     "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|>"
     "<|vision_end|>Describe.<|im_end|>\n<|im_start|>assistant\n"),
]


def make_chat_fixtures() -> None:
    template = TEMPLATE_PATH.read_text(encoding="utf-8")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_JSON))

    def render(messages, agp, vision_id=False, tools=None):
        kw = {}
        if vision_id:
            kw["add_vision_id"] = True
        return tok.apply_chat_template(copy.deepcopy(messages), chat_template=template,
                                       tokenize=False, add_generation_prompt=agp, tools=tools,
                                       **kw)

    for messages, agp, expected in OLLAMA_CHECKS:
        got = render(messages, agp)
        if got != expected:
            raise SystemExit(f"template cross-check failed:\n{got!r}\n!=\n{expected!r}")
    cases = chat_cases()
    names = set()
    for c in cases:
        assert c["name"] not in names
        names.add(c["name"])
        c["rendered"] = render(c["messages"], c["add_generation_prompt"], c["add_vision_id"],
                               c.get("tools"))
    (CHAT_DIR / "cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
    print(f"chat_template: {len(cases)} cases rendered, {len(OLLAMA_CHECKS)} cross-checks ok")


# ----------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=None,
                    help="'chat' or a checkpoint name (repeatable); default: everything")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    only = set(args.only) if args.only else None
    unknown = (only or set()) - set(CHECKPOINTS) - {"chat"}
    if unknown:
        ap.error(f"unknown --only {sorted(unknown)}")
    t0 = time.time()
    if only is None or "chat" in only:
        make_chat_fixtures()
    for name, spec in CHECKPOINTS.items():
        if only is None or name in only:
            make_checkpoint(name, spec)
    print(f"done in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
