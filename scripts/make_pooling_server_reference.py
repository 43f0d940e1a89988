#!/usr/bin/env python3
"""End-to-end references for `vlm serve --task embed|rerank`: what Qwen3-VL-Embedding's and
Qwen3-VL-Reranker's own code computes, recorded with transformers on a tiny checkpoint, into
tests/model/fixtures/pooling-server/ (reference.json, and the images and frames it sends).

The checkpoint is tests/model/fixtures/tiny-fullvocab-bf16 (full Qwen vocabulary, vision tower)
with the real tokenizer (tests/data/tokenizer) and the Qwen3-VL chat template; the server tests
give it the published layouts (an embedder: sentence-transformers' modules.json and last-token
pooling config; a reranker: the plain Qwen3-VL checkpoint, served with --task rerank).

The pipeline is the models' own (QwenLM/Qwen3-VL-Embedding, src/models/qwen3_vl_embedding.py
and qwen3_vl_reranker.py), step for step:
- the conversation: an embedding is a system message with the instruction (stripped, a full stop
  appended unless it ends in Unicode punctuation, default "Represent the user's input.") and a
  user message of the input's videos, images and text (or "NULL"); a rerank is the fixed system
  message and one user message "<Instruct>: I", "<Query>:", the query's parts, "\\n<Document>:",
  the document's parts. The chat template renders it with the generation prompt.
- the media: qwen-vl-utils' process_vision_info (pinned) on the conversation, with the models'
  settings (images within 4·32² .. 1800·32² pixels; a video as a list of frames, total_pixels
  10·768·32², at its 2 frames a second), then the processor with do_resize=False. The images
  and frames here are multiples of 32 pixels a side inside those budgets (a frame 384², above
  qwen-vl-utils' 128·32² per frame), so no resize happens: vlm resizes in uint8 where
  qwen-vl-utils resizes videos in float, which would differ in the last bits.
- the model: Qwen3VLModel's last_hidden_state at the last token, in float32 with eager
  attention; an embedding L2-normalised, a score sigmoid(h · (lm_head[yes] − lm_head[no])).

Each case records the request the test sends (images as files beside reference.json) and the
expected raw hidden state, embedding or score, and the prompt's token count.

Usage (transformers 4.57.1, torch, as in scripts/requirements-reference.txt):
    python scripts/make_pooling_server_reference.py         # a few seconds
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image
from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
from transformers.models.qwen2_vl.image_processing_qwen2_vl_fast import Qwen2VLImageProcessorFast
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

import make_pooling_prompts as mp  # the models' message layout
from qwen_vl_utils import process_vision_info

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "tests/model/fixtures/tiny-fullvocab-bf16"
OUT = REPO / "tests/model/fixtures/pooling-server"
TEMPLATE = REPO / "tests/model/fixtures/chat_template/chat_template.jinja"

COMMON = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
              image_std=[0.5] * 3)
IMAGE_BUDGET = {"shortest_edge": 4 * 32 * 32, "longest_edge": 1800 * 32 * 32}
FRAMES_TOTAL_PIXELS = 10 * 768 * 32 * 32
FRAMES_FPS = 2.0  # qwen-vl-utils' rate of a list of frames

# name: (width, height); synthetic, seeded.
IMAGES = {"red.png": (64, 64), "wide.png": (96, 64)}
FRAMES = [f"frame{i}.png" for i in range(4)]  # 384x384, one video


def make_media() -> None:
    rng = np.random.default_rng(11)
    for name, (w, h) in IMAGES.items():
        arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        if name == "red.png":
            arr[..., 0] = np.maximum(arr[..., 0], 200)
        Image.fromarray(arr).save(OUT / name, optimize=True)
    # Smooth frames (small files): a gradient with a square moving across it.
    y, x = np.mgrid[0:384, 0:384]
    for i, name in enumerate(FRAMES):
        arr = np.stack([(x * 255 // 383), (y * 255 // 383), np.full_like(x, 60 * i)], axis=-1)
        arr[96:192, 40 + 64 * i:136 + 64 * i] = (250, 250, 40)
        Image.fromarray(arr.astype(np.uint8)).save(OUT / name, optimize=True)


def rgb(name: str) -> Image.Image:
    with Image.open(OUT / name) as im:
        return im.convert("RGB")


def parts(side: dict) -> list[dict]:
    """The models' content items (format_model_input): videos, images, then the text."""
    out = [{"type": "video", "video": [rgb(f) for f in v], "total_pixels": FRAMES_TOTAL_PIXELS}
           for v in side.get("videos", [])]
    out += [{"type": "image", "image": rgb(i), "min_pixels": IMAGE_BUDGET["shortest_edge"],
             "max_pixels": IMAGE_BUDGET["longest_edge"]} for i in side.get("images", [])]
    if side.get("text"):
        out.append({"type": "text", "text": side["text"]})
    return out


def run(model, processor, template, messages) -> tuple[torch.Tensor, int]:
    """The last token's hidden state and the prompt's length, as the models' code computes it
    (_preprocess_inputs / tokenize)."""
    text = processor.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=True)
    images, videos, video_kwargs = process_vision_info(
        [messages], image_patch_size=16, return_video_metadata=True, return_video_kwargs=True)
    metas = None
    if videos is not None:
        videos, metas = (list(x) for x in zip(*videos))
    enc = processor(text=[text], images=images, videos=videos, video_metadata=metas,
                    do_resize=False, return_tensors="pt", **video_kwargs)
    with torch.no_grad():
        out = model.model(**{k: v for k, v in enc.items() if k != "token_type_ids"})
    return out.last_hidden_state[0, -1], int(enc["input_ids"].shape[1])


EMBED_CASES = [
    dict(name="text", text="A woman playing with her dog on a beach at sunset."),
    dict(name="text_instruction", text="a dog on a beach",
         instruction="Retrieve images or text relevant to the user's query"),
    dict(name="empty", text=""),
    dict(name="image", images=["red.png"]),
    dict(name="image_text", images=["wide.png"], text="a wide picture",
         instruction="Find the matching picture."),
    dict(name="video", videos=[FRAMES], text="frames sliding"),
    dict(name="mixed", videos=[FRAMES], images=["red.png", "wide.png"], text="all of it",
         instruction="Represent this for retrieval:"),
]

RERANK_QUERY = dict(text="Which picture is mostly red?")
RERANK_DOCS = [dict(text="A red square."), dict(images=["red.png"]),
               dict(images=["wide.png"], text="A wide noisy picture."), dict(videos=[FRAMES])]
RERANK_INSTRUCTION = "Retrieve the picture the query describes."
RERANK_IMAGE_QUERY = dict(images=["wide.png"])


def main() -> int:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    OUT.mkdir(parents=True, exist_ok=True)
    make_media()
    template = TEMPLATE.read_text()
    tok = AutoTokenizer.from_pretrained(REPO / "tests/data/tokenizer")
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessorFast(**COMMON, size=IMAGE_BUDGET),
        video_processor=Qwen3VLVideoProcessor(**COMMON, fps=2, min_frames=4, max_frames=768),
        tokenizer=tok, chat_template=template)
    model = Qwen3VLForConditionalGeneration.from_pretrained(
        MODEL, dtype=torch.float32, attn_implementation="eager").eval()
    no, yes = tok.convert_tokens_to_ids("no"), tok.convert_tokens_to_ids("yes")
    w = model.lm_head.weight.detach()

    embed = []
    for c in EMBED_CASES:
        h, n = run(model, processor, template,
                   mp.embed_messages(c, c.get("instruction", ""), parts=parts))
        e = torch.nn.functional.normalize(h, p=2, dim=-1)
        embed.append(dict(c, prompt_tokens=n, hidden=h.tolist(), embedding=e.tolist()))
        print(f"  embed {c['name']}: {n} tokens")

    def scores(query: dict, instruction: str) -> list[dict]:
        out = []
        for d in RERANK_DOCS:
            h, n = run(model, processor, template,
                       mp.rerank_messages(query, d, instruction, parts=parts))
            logit = float(h @ (w[yes] - w[no]))
            out.append(dict(document=d, prompt_tokens=n, logit=logit,
                            score=float(torch.sigmoid(torch.tensor(logit, dtype=torch.float64)))))
        return out

    rerank = [dict(name="text_query", query=RERANK_QUERY, instruction="",
                   results=scores(RERANK_QUERY, "")),
              dict(name="instruction", query=RERANK_QUERY, instruction=RERANK_INSTRUCTION,
                   results=scores(RERANK_QUERY, RERANK_INSTRUCTION)),
              dict(name="image_query", query=RERANK_IMAGE_QUERY, instruction="",
                   results=scores(RERANK_IMAGE_QUERY, ""))]
    ref = {
        "generator": "scripts/make_pooling_server_reference.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": str(MODEL.relative_to(REPO)),
        "frames_fps": FRAMES_FPS,
        "no_yes": [no, yes],
        "embed": embed,
        "rerank": rerank,
    }
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"wrote {OUT / 'reference.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
