#!/usr/bin/env python3
"""Trains the tiny demo models that answer questions about synthetic shape images and clips.

Everything is generated here: images of 1-5 coloured shapes on plain backgrounds, short clips of
1-3 moving shapes, chat-formatted questions and answers about them, a byte-level BPE tokenizer
(the `tokenizers` library, with Qwen's pre-tokenizer and special-token strings, so vlm loads it
through the same tokenizer.json path as the real one), and a model of the real architecture at a
tiny size, trained on the CPU in two stages: pictures, then pictures and clips together from the
first stage's weights (--init; the tokenizer is kept). Two architectures (--arch):

- qwen3_5 (the default model, models/tiny-qwen35; transformers 5.x,
  scripts/requirements-reference-qwen35.txt): Qwen3_5ForConditionalGeneration with 4 text layers,
  3 Gated DeltaNet and 1 gated full attention (the published models' 3:1 pattern), and a vision
  tower without DeepStack. Its first stage starts the vision tower, the token embeddings and the
  tokenizer from the Qwen3-VL demo model's (--tower-from: same sizes, DeepStack mergers left out)
  and trains everything, so that both stages fit a 2-core afternoon:

  python scripts/train_tiny_vlm.py --tower-from models/tiny-qwen3vl --out STAGE1_DIR \
      --steps 2000 --lr 2e-3 --batch 32 --turns 8 --text-hidden 128 --vision-hidden 128 \
      --vision-depth 3 --eval-every 1000                                  # ~32 min on 2 cores
  python scripts/train_tiny_vlm.py --init STAGE1_DIR --out STAGE2_DIR --steps 1500 \
      --batch 32 --clips 16 --lr 1e-3 --turns 8 --eval-every 500         # ~36 min on 2 cores
  python scripts/train_tiny_vlm.py --init STAGE2_DIR --out models/tiny-qwen35 --steps 600 \
      --batch 32 --clips 16 --lr 5e-4 --warmup 50 --turns 8 --eval-every 300 --seed 3  # ~15 min
  python scripts/train_tiny_vlm.py --load models/tiny-qwen35 --fixture-n 100 \
      --fixture-out tests/model/fixtures/shapes-qa --clip-fixture-out tests/model/fixtures/motion-qa \
      --example-out examples/shapes.png --clip-example-out examples/motion.gif

- qwen3_vl (models/tiny-qwen3vl, the default before and now a second fixture; transformers 4.57.1,
  scripts/requirements-reference.txt): Qwen3VLForConditionalGeneration with 3 text layers and
  DeepStack taps after every vision block, trained from scratch:

  python scripts/train_tiny_vlm.py --arch qwen3_vl --out STAGE1_DIR --steps 8000 --lr 3e-3 \
      --batch 32 --turns 8 --text-hidden 128 --vision-hidden 128 --vision-depth 3  # ~75 min
  python scripts/train_tiny_vlm.py --init STAGE1_DIR --out models/tiny-qwen3vl --steps 3000 \
      --batch 32 --clips 16 --lr 1.5e-3 --turns 8 --eval-every 500         # ~60 min on 2 cores
  python scripts/train_tiny_vlm.py --load models/tiny-qwen3vl --fixture-n 100 \
      --fixture-out tests/model/fixtures/shapes-qa --clip-fixture-out tests/model/fixtures/motion-qa

--fixture-out writes held-out scenes (a seed training never used) as PNG files with one question
each, the true answer and transformers' greedy answer in cases-MODEL.json (MODEL the model's
folder name: the scenes depend on the seed alone, so both models' cases share them);
--clip-fixture-out the same for clips, as animated GIFs (decoded back with PyAV and checked to be
the rendered frames); --example-out and --clip-example-out the README's example picture and
clip. Needs torch, transformers, tokenizers, Pillow and PyAV; CI never runs it.

Clips (Clip): 2-4 seconds at 4 or 5 frames a second, 96-160 px a side, sampled as
Qwen3VLVideoProcessor does at 2 frames a second (4-8 frames: 2-4 temporal groups, each with its
"<t seconds>" timestamp). Every shape moves left, right, up or down at a steady speed; the first
is there from the start, the others appear later. Questions: "Which way does the red circle
move?" (Left. / Right. / Up. / Down.), "How many shapes appear?", "Which shape appears first?"
(The red circle.). The vision tower's auxiliary loss on clips asks, per temporal group, what each
merged token holds and which way that object moves (clip_token_classes).

Scenes: 1-5 shapes, one per cell of the image's 3 x 3 grid (the thirds "Where is" answers name),
96-192 px per side, so smart_resize both rounds and scales down (MIN/MAX_PIXELS below). Each
training sample is one scene with all its questions as a multi-turn chat (the first turn is
exactly what `vlm run` sends). The answer loss is averaged per answer, so that "Describe" does
not dominate, and an auxiliary loss trains the vision tower directly: a linear probe (thrown
away) on its merged tokens must tell the shape and colour of the object centred on each token
and that object's ninth of the image (token_classes). The previous setting (random placement,
one question per sample, no auxiliary loss, 1.7 M parameters) reached 42% after 7000 steps, with
position answers at 15%. Short trials of the parts on the way (2000 steps or less) all stayed at
28-38% with position answers at chance; the Qwen3-VL run from scratch too, until it passed 2000
steps.

Measured for the Qwen3.5 model (the qwen3_5 commands above; held-out accuracy on 200 scenes,
seed 777, and 200 clips, seed 779, one question each, exact answer; 2 cores of an "Intel(R)
Xeon(R) Processor" VM with AVX-512 VNNI, transformers 5.25.0 with its PyTorch fallbacks of the
Gated DeltaNet kernels). The second stage ran as two runs, the second resumed from the first's
weights with a new learning-rate schedule and new samples (--seed 3) of the same mix:
  | run | steps | scenes | colour | "How many shapes" | "How many X" | "Describe" | "Where is" | clips | "Which way" | "appear" | "first" |
  |---|---|---|---|---|---|---|---|---|---|---|---|
  | 1 | 1000 | 88.0% | 21/21 | 19/25 | 86/94 | 14/24 | 36/36 | — | — | — | — |
  | 1 | 2000 | 95.5% | 21/21 | 24/25 | 92/94 | 18/24 | 36/36 | — | — | — | — |
  | 2 | 500 | 91.5% | 21/21 | 23/25 | 86/94 | 17/24 | 36/36 | 89.5% | 84/88 | 44/56 | 51/56 |
  | 2 | 1000 | 93.5% | 21/21 | 23/25 | 89/94 | 18/24 | 36/36 | 92.5% | 80/88 | 51/56 | 54/56 |
  | 2 | 1500 | 93.5% | 21/21 | 24/25 | 89/94 | 17/24 | 36/36 | 93.5% | 84/88 | 51/56 | 52/56 |
  | 2, resumed | 300 | 94.5% | 21/21 | 23/25 | 90/94 | 19/24 | 36/36 | 92.0% | 82/88 | 51/56 | 51/56 |
  | 2, resumed | 600 | **96.5%** | 21/21 | 25/25 | 90/94 | 21/24 | 36/36 | **93.5%** | 83/88 | 51/56 | 53/56 |

1918 s for stage 1 (2000 steps), 2177 s + 871 s for stage 2 (1500 + 600 steps): 83 min in all,
against 133 min for the Qwen3-VL model's 8000 + 3000 steps from scratch (below), which reach
96.0% and 93.0%. 2.03 M parameters (text: 4 layers, hidden 128; the Gated DeltaNet layers 2 key
heads and 4 value heads of 32, a 4-tap convolution; the attention layer 4 query and 2 KV heads of
32, a quarter rotary; vocabulary 422; vision: 3 blocks, hidden 128), 8.1 MB in f32. The shipped
CI fixtures: scenes (seed 4242, 100 scenes) transformers 96.0%, clips (seed 4343, 100 clips)
transformers 95.0%; vlm's greedy answers equal transformers' on all 200 at every CPU ISA level
(generic, avx2, avx2vnni, avx512, avx512vnni) and with the KV cache in f32, BF16 and INT8.

Measured for the Qwen3-VL model (its first command, from scratch; held-out accuracy on 200
scenes, one question each, exact answer):
  | steps | all | colour | "How many shapes" | "How many X" | "Describe" | "Where is" |
  |---|---|---|---|---|---|---|
  | 1000 | 33.0% | 9/21 | 10/25 | 41/94 | 2/24 | 4/36 |
  | 2000 | 38.5% | 13/21 | 16/25 | 44/94 | 2/24 | 2/36 |
  | 3000 | 60.0% | 17/21 | 20/25 | 60/94 | 6/24 | 17/36 |
  | 4000 | 75.0% | 20/21 | 18/25 | 76/94 | 12/24 | 24/36 |
  | 5000 | 90.0% | 21/21 | 22/25 | 87/94 | 16/24 | 34/36 |
  | 6000 | 93.0% | 21/21 | 23/25 | 88/94 | 18/24 | 36/36 |
  | 7000 | 95.0% | 21/21 | 24/25 | 88/94 | 21/24 | 36/36 |
  | 8000 | **96.0%** | 21/21 | 23/25 | 92/94 | 20/24 | 36/36 |

2.78 M parameters (text: 3 layers, hidden 128, 4 query and 2 KV heads of 32, vocabulary 422;
vision: 3 blocks, hidden 128, DeepStack taps after each), 11.1 MB in f32; 4505 s for 8000
steps on 2 cores (Sapphire Rapids VM). That model answered the CI fixture of scenes (seed 4242,
100 scenes) 97.0% right.

Its stage 2 (the second command; held-out accuracy on the same 200 scenes and on 200 clips, seed
779, one question each, exact answer; 16 scenes and 16 clips a step, each with all its questions):
  | steps | scenes | clips | "Which way" | "How many shapes appear" | "Which shape appears first" |
  |---|---|---|---|---|---|
  | 0 (stage 1) | 96.0% | — | — | — | — |
  | 500 | 85.0% | 60.0% | 36/88 | 45/56 | 39/56 |
  | 1000 | 87.0% | 85.0% | 76/88 | 47/56 | 47/56 |
  | 1500 | 90.5% | 88.5% | 79/88 | 52/56 | 46/56 |
  | 2000 | 94.5% | 92.0% | 81/88 | 55/56 | 48/56 |
  | 2500 | 94.5% | 93.0% | 80/88 | 56/56 | 50/56 |
  | 3000 | **96.0%** | **93.0%** | 80/88 | 56/56 | 50/56 |

3492 s for the 3000 steps on 2 cores (an "Intel(R) Xeon(R) Processor" VM with AVX-512 VNNI).
Same size and parameters as stage 1; the clips only add video_preprocessor_config.json. The
shipped CI fixtures: scenes (seed 4242) transformers 95.0%, clips (seed 4343, 100 clips)
transformers 92.0%; vlm's greedy answers equal transformers' on all 200 on every CPU kernel
level (generic, avx2, avx512, avx512vnni).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image, ImageDraw
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (Qwen2TokenizerFast, Qwen2VLImageProcessorFast, Qwen3VLConfig,
                          Qwen3VLForConditionalGeneration)
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.video_utils import VideoMetadata

REPO = Path(__file__).resolve().parent.parent
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 230),
    "yellow": (235, 210, 40),
    "purple": (150, 60, 200),
    "orange": (245, 140, 30),
}
BACKGROUNDS = [(250, 250, 250), (20, 20, 20), (128, 128, 128), (235, 225, 200), (200, 220, 240)]
SIZES = [96, 112, 128, 144, 160, 176, 192]
SHAPES = ["circle", "square", "triangle"]
NUMBERS = ["zero", "one", "two", "three", "four", "five"]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
           "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
           "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
           "<|video_pad|>"]
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3-VL's preprocessor (patch 16, merge 2, temporal 2, mean/std 0.5) with a small budget.
MIN_PIXELS, MAX_PIXELS = 4 * 32 * 32, 25 * 32 * 32
PROCESSOR = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                 image_std=[0.5] * 3, size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS})
# Videos: Qwen3VLVideoProcessor's sampling (2 frames a second, at least 4) and a budget over all
# sampled frames that keeps a clip's frames at their size (at most 8 frames of 160 x 160).
VIDEO_PROCESSOR = dict(PROCESSOR, size={"shortest_edge": 4 * 64 * 64, "longest_edge": 8 * 160 * 160},
                       fps=2, min_frames=4, max_frames=16)
CLIP_SIZES = [96, 112, 128, 144, 160]
CLIP_SECONDS = [2, 3, 4]
CLIP_FPS = [4, 5]
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------

def draw_shape(d: ImageDraw.ImageDraw, shape: str, box, colour) -> None:
    x0, y0, x1, y1 = box
    if shape == "circle":
        d.ellipse(box, fill=colour)
    elif shape == "square":
        d.rectangle(box, fill=colour)
    else:
        d.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=colour)


def make_scene(rng: random.Random):
    """An image and its objects: [(shape, colour, cell centre x / width, cell centre y / height,
    box centre x / width, box centre y / height)].

    Objects sit one per cell of the image's 3 x 3 grid (the cells are the thirds that "Where is"
    answers name), jittered inside their cell, so every position answer is unambiguous. Sizes
    and aspect ratios vary; some are not multiples of 32 and some exceed MAX_PIXELS, so
    smart_resize both rounds and scales down."""
    w, h = rng.choice(SIZES), rng.choice(SIZES)
    bg = rng.choice(BACKGROUNDS)
    img = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(img)
    n = rng.randint(1, 5)
    objects = []
    for cell in sorted(rng.sample(range(9), n)):
        cx0, cy0 = (cell % 3) * w / 3, (cell // 3) * h / 3
        cw, ch = w / 3, h / 3
        s = int(min(cw, ch) * rng.uniform(0.6, 0.9))
        x0 = int(cx0 + rng.uniform(0, cw - s))
        y0 = int(cy0 + rng.uniform(0, ch - s))
        box = (x0, y0, x0 + s, y0 + s)
        shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
        draw_shape(d, shape, box, COLOURS[colour])
        objects.append((shape, colour, (cell % 3 + 0.5) / 3, (cell // 3 + 0.5) / 3,
                        (box[0] + box[2]) / 2 / w, (box[1] + box[3]) / 2 / h))
    return img, objects


def describe(objects) -> str:
    """Every object in reading order (rows top to bottom, left to right in a row)."""
    parts = [f"{'an' if colour[0] in 'aeiou' else 'a'} {colour} {shape}" for shape, colour, *_ in objects]
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return text[0].upper() + text[1:] + "."


def where(x: float, y: float) -> str:
    horiz = "left" if x < 1 / 3 else "right" if x > 2 / 3 else "middle"
    vert = "top" if y < 1 / 3 else "bottom" if y > 2 / 3 else "middle"
    if horiz == "middle" and vert == "middle":
        return "In the centre."
    if vert == "middle":
        return f"On the {horiz}."
    if horiz == "middle":
        return f"At the {vert}."
    return f"At the {vert} {horiz}."


def questions(objects, rng: random.Random):
    """(question, answer) pairs about one scene."""
    out = [("Describe the image.", describe(objects)),
           ("How many shapes are there?", NUMBERS[len(objects)].capitalize() + ".")]
    for shape in SHAPES:
        same = [o for o in objects if o[0] == shape]
        out.append((f"How many {shape}s are there?", NUMBERS[len(same)].capitalize() + "."))
        if len(same) == 1:
            out.append((f"What colour is the {shape}?", same[0][1].capitalize() + "."))
            out.append((f"Where is the {shape}?", where(same[0][2], same[0][3])))
    rng.shuffle(out)
    return out


def sample_indices(total: int, fps: float) -> list[int]:
    """Qwen3VLVideoProcessor.sample_frames with VIDEO_PROCESSOR's settings: the frames transformers
    (and vlm) take from a clip of `total` frames at `fps`."""
    n = int(total / fps * VIDEO_PROCESSOR["fps"])
    n = min(min(max(n, VIDEO_PROCESSOR["min_frames"]), VIDEO_PROCESSOR["max_frames"]), total)
    return np.linspace(0, total - 1, n).round().astype(int).tolist()


class Clip:
    """A short clip of 1-3 shapes that each move in a straight line (left, right, up or down) at
    a steady speed; the first is there from the start, the others appear later, each at the first
    sampled frame of a temporal group (two sampled frames), so that it is in every frame of that
    group. No two shapes ever touch. 2-4 seconds at 4 or 5 frames a second, 96-160 px a side."""

    def __init__(self, rng: random.Random):
        self.w, self.h = rng.choice(CLIP_SIZES), rng.choice(CLIP_SIZES)
        self.bg = rng.choice(BACKGROUNDS)
        self.fps = rng.choice(CLIP_FPS)
        self.total = rng.choice(CLIP_SECONDS) * self.fps
        self.indices = sample_indices(self.total, self.fps)
        groups = len(self.indices) // 2
        kinds = rng.sample([(s, c) for s in SHAPES for c in COLOURS], 3)
        for n in range(rng.randint(1, 3), 0, -1):
            for _ in range(100):
                self.objects = [self.place(rng, *kinds[k], 0 if k == 0 else
                                           self.indices[2 * rng.randint(1, groups - 1)])
                                for k in range(n)]
                if not self.collides():
                    return
        raise AssertionError("no clip")

    def place(self, rng: random.Random, shape: str, colour: str, appear: int):
        s = int(min(self.w, self.h) * rng.uniform(0.2, 0.28))
        direction = rng.choice(list(DIRECTIONS))
        dx, dy = DIRECTIONS[direction]
        travel = (self.w if dx else self.h) * rng.uniform(0.35, 0.5)  # over the whole clip
        x0 = rng.uniform(max(0, -dx * travel), self.w - s - max(0, dx * travel))
        y0 = rng.uniform(max(0, -dy * travel), self.h - s - max(0, dy * travel))
        step = travel / (self.total - 1)
        return dict(shape=shape, colour=colour, size=s, x0=x0, y0=y0, dx=dx * step, dy=dy * step,
                    direction=direction, appear=appear)

    def box(self, o, i: int):
        x, y = int(o["x0"] + o["dx"] * i), int(o["y0"] + o["dy"] * i)
        return x, y, x + o["size"], y + o["size"]

    def collides(self) -> bool:
        for i in range(self.total):
            boxes = [self.box(o, i) for o in self.objects if o["appear"] <= i]
            for a in range(len(boxes)):
                for b in range(a):
                    p, q = boxes[a], boxes[b]
                    if p[0] < q[2] + 3 and q[0] < p[2] + 3 and p[1] < q[3] + 3 and q[1] < p[3] + 3:
                        return True
        return False

    def frame(self, i: int) -> Image.Image:
        img = Image.new("RGB", (self.w, self.h), self.bg)
        d = ImageDraw.Draw(img)
        for o in self.objects:
            if o["appear"] <= i:
                draw_shape(d, o["shape"], self.box(o, i), COLOURS[o["colour"]])
        return img

    def sampled(self) -> torch.Tensor:
        """The sampled frames as the video processor takes them: [frames, 3, h, w] uint8."""
        return torch.stack([torch.frombuffer(bytearray(self.frame(i).tobytes()), dtype=torch.uint8)
                            .view(self.h, self.w, 3).permute(2, 0, 1) for i in self.indices])

    def metadata(self) -> VideoMetadata:
        return VideoMetadata(total_num_frames=self.total, fps=float(self.fps),
                             frames_indices=list(self.indices))


def name(o) -> str:
    return f"{o['colour']} {o['shape']}"


def clip_questions(clip: Clip, rng: random.Random):
    """(question, answer) pairs about one clip: the way each shape moves (those in at least two
    temporal groups), how many shapes appear, and which appears first."""
    groups = len(clip.indices) // 2
    out = [("How many shapes appear?", NUMBERS[len(clip.objects)].capitalize() + "."),
           ("Which shape appears first?", f"The {name(clip.objects[0])}.")]
    for o in clip.objects:
        if o["appear"] <= clip.indices[2 * (groups - 2)]:
            out.append((f"Which way does the {name(o)} move?", o["direction"].capitalize() + "."))
    rng.shuffle(out)
    return out


# ----------------------------------------------------------------------------------------------
# tokenizer
# ----------------------------------------------------------------------------------------------

def train_tokenizer(texts, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens(SPECIAL)
    return tok


def chat(question: str, answer: str | None, pad: str = "<|image_pad|>") -> str:
    """The Qwen3-VL Instruct template's rendering of one user turn (the image or video first) and
    the answer."""
    s = ("<|im_start|>user\n<|vision_start|>" + pad + "<|vision_end|>" + question +
         "<|im_end|>\n<|im_start|>assistant\n")
    return s if answer is None else s + answer + "<|im_end|>\n"


# ----------------------------------------------------------------------------------------------
# model and training
# ----------------------------------------------------------------------------------------------

def make_config(tok: Tokenizer, arch: str, text_hidden: int = 96, vision_hidden: int = 64,
                vision_depth: int = 2):
    """The model's config: Qwen3-VL (3 layers of full attention; DeepStack taps after every
    vision block) or Qwen3.5 (4 layers: 3 Gated DeltaNet + 1 gated full attention, head_dim 32
    with a quarter of it rotary as in the published models; a tower without DeepStack)."""
    ids = {t: tok.token_to_id(t) for t in SPECIAL}
    text = dict(vocab_size=tok.get_vocab_size(), hidden_size=text_hidden,
                intermediate_size=text_hidden * 8 // 3 // 32 * 32, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                max_position_embeddings=4096, tie_word_embeddings=True,
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    vision = dict(depth=vision_depth, hidden_size=vision_hidden, num_heads=4,
                  intermediate_size=2 * vision_hidden, patch_size=16, temporal_patch_size=2,
                  spatial_merge_size=2, in_channels=3, hidden_act="gelu_pytorch_tanh",
                  out_hidden_size=text_hidden, num_position_embeddings=2304)
    tokens = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"],
                  vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True)
    if arch == "qwen3_vl":
        text.update(num_hidden_layers=3, rope_theta=5e6,
                    rope_scaling={"rope_type": "default", "mrope_section": [8, 4, 4],
                                  "mrope_interleaved": True})
        vision.update(deepstack_visual_indexes=list(range(min(vision_depth, 3))))
        return Qwen3VLConfig(text_config=text, vision_config=vision, **tokens)
    Qwen3_5Config = qwen35_class("Qwen3_5Config")
    text.update(num_hidden_layers=4, full_attention_interval=4, hidden_act="silu",
                linear_num_key_heads=2, linear_key_head_dim=32, linear_num_value_heads=4,
                linear_value_head_dim=32, linear_conv_kernel_dim=4,
                rope_parameters=dict(rope_type="default", rope_theta=1e7,
                                     partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                                     mrope_interleaved=True))
    return Qwen3_5Config(text_config=text, vision_config=vision, **tokens)


def qwen35_class(name: str):
    """A Qwen3.5 class of transformers 5.x, or a clear error on 4.x."""
    try:
        return getattr(transformers, name)
    except AttributeError:
        raise SystemExit(f"the qwen3_5 architecture needs transformers 5.x "
                         f"(scripts/requirements-reference-qwen35.txt), not "
                         f"{transformers.__version__}; --arch qwen3_vl trains the Qwen3-VL model")


def model_class(model_type: str):
    """The transformers class of a saved model's (or a config's) model_type."""
    if model_type == "qwen3_vl":
        return Qwen3VLForConditionalGeneration
    if model_type == "qwen3_5":
        return qwen35_class("Qwen3_5ForConditionalGeneration")
    raise ValueError(f"unknown model_type {model_type!r}")


def load_model(model_dir: Path):
    kind = json.loads((model_dir / "config.json").read_text())["model_type"]
    return model_class(kind).from_pretrained(model_dir)


@torch.no_grad()
def copy_tower(model, src_dir: Path) -> None:
    """Starts the vision tower and the token embeddings from a trained model's (same tokenizer,
    same sizes): every tensor of model.visual and embed_tokens takes the same-named, same-shaped
    tensor there. Every tower tensor there must be taken, except Qwen3-VL's DeepStack mergers,
    which this model has not."""
    src = load_model(src_dir).state_dict()
    dst = model.state_dict()

    def wanted(n: str) -> bool:
        return ".visual." in "." + n or n.endswith("embed_tokens.weight")

    for n in filter(wanted, dst):
        if n not in src or src[n].shape != dst[n].shape:
            raise ValueError(f"{src_dir} has no tensor {n} of shape {tuple(dst[n].shape)}")
        dst[n].copy_(src[n])
    left = [n for n in src if wanted(n) and n not in dst and "deepstack" not in n]
    if left:
        raise ValueError(f"{src_dir} has tower tensors this model lacks (another depth?): {left[:3]}")
    print(f"started the vision tower and the embeddings from {src_dir}")


class Encoder:
    """Turns (image, question, answer) into model inputs: the image's pixel values and grid, and
    ids with <|image_pad|> repeated once per merged patch; labels only on the answer + <|im_end|>.
    Videos go through transformers' Qwen3VLProcessor, which samples nothing here (the clip's
    sampled frames and their indices are given) but writes the "<t seconds>" timestamps and the
    pads of each temporal group, as at inference."""

    def __init__(self, tok: Tokenizer, model_type: str):
        self.tok = tok
        self.proc = Qwen2VLImageProcessorFast(**PROCESSOR)
        self.pad = tok.token_to_id("<|image_pad|>")
        self.video_pad = tok.token_to_id("<|video_pad|>")
        self.token_types = model_type == "qwen3_5"  # transformers 5 wants mm_token_type_ids
        self.video_proc = Qwen3VLProcessor(
            image_processor=self.proc, video_processor=Qwen3VLVideoProcessor(**VIDEO_PROCESSOR),
            tokenizer=Qwen2TokenizerFast(tokenizer_object=tok))

    def video(self, clip: "Clip", question: str):
        """The prompt ids of a question about a clip, its pixel values and grid."""
        out = self.video_proc(text=[chat(question, None, "<|video_pad|>")], videos=[clip.sampled()],
                              video_metadata=[clip.metadata()], do_sample_frames=False,
                              return_tensors="pt")
        return out["input_ids"][0].tolist(), out["pixel_values_videos"], out["video_grid_thw"]

    def with_types(self, inputs: dict) -> dict:
        """inputs plus, for a Qwen3.5, mm_token_type_ids as the processor makes them (text 0,
        image 1, video 2), from which transformers 5 computes the multimodal positions."""
        if self.token_types:
            ids = inputs["input_ids"]
            inputs["mm_token_type_ids"] = (ids == self.pad).long() + 2 * (ids == self.video_pad).long()
        return inputs

    def image(self, img: Image.Image):
        out = self.proc(images=[img], min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
                        return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]

    def conversation(self, qas, n_pads: int, first=None):
        """ids and labels of a multi-turn chat about one image or video (in the first turn; its
        prompt ids are `first` for a video)."""
        if first is None:
            ids, labels = self.ids(*qas[0], n_pads)
        else:
            reply = self.tok.encode(qas[0][1] + "<|im_end|>").ids
            ids, labels = first + reply, [-100] * len(first) + reply
        for q, a in qas[1:]:
            turn = self.tok.encode("\n<|im_start|>user\n" + q + "<|im_end|>\n<|im_start|>assistant\n").ids
            reply = self.tok.encode(a + "<|im_end|>").ids
            ids += turn + reply
            labels += [-100] * len(turn) + reply
        return ids, labels

    def ids(self, question: str, answer: str | None, n_pads: int):
        prompt = self.tok.encode(chat(question, None)).ids
        i = prompt.index(self.pad)
        prompt = prompt[:i] + [self.pad] * n_pads + prompt[i + 1:]
        if answer is None:
            return prompt, None
        full = self.tok.encode(answer + "<|im_end|>").ids
        return prompt + full, [-100] * len(prompt) + full


def batch(enc: Encoder, samples):
    """Model inputs for a batch of scenes (img, objects, qas) and clips (Clip, qas)."""
    pixel, grids, seqs, labels = [], [], [], []
    tokens, vpixel, vgrids, vtokens = [], [], [], []
    for sample in samples:
        if isinstance(sample[0], Clip):
            clip, qas = sample
            first, pv, grid = enc.video(clip, qas[0][0])
            ids, lab = enc.conversation(qas, 0, first)
            vtokens.append(clip_token_classes(clip, int(grid[0, 1]) // 2, int(grid[0, 2]) // 2))
            vpixel.append(pv)
            vgrids.append(grid)
        else:
            img, objects, qas = sample
            pv, grid = enc.image(img)
            ids, lab = enc.conversation(qas, int(grid.prod()) // 4)
            tokens.append(token_classes(objects, int(grid[0, 1]) // 2, int(grid[0, 2]) // 2))
            pixel.append(pv)
            grids.append(grid)
        seqs.append(ids)
        labels.append(lab)
    n = max(len(s) for s in seqs)
    pad_id = enc.tok.token_to_id("<|endoftext|>")
    input_ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), n), dtype=torch.long)
    lab = torch.full((len(seqs), n), -100, dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        input_ids[i, :len(s)] = torch.tensor(s)
        attn[i, :len(s)] = 1
        lab[i, :len(l)] = torch.tensor(l)
    out = enc.with_types(dict(input_ids=input_ids, attention_mask=attn, labels=lab))
    if pixel:
        out.update(pixel_values=torch.cat(pixel), image_grid_thw=torch.cat(grids),
                   token_classes=torch.cat(tokens))
    if vpixel:
        out.update(pixel_values_videos=torch.cat(vpixel), video_grid_thw=torch.cat(vgrids),
                   video_token_classes=torch.cat(vtokens))
    return out


def token_classes(objects, rows: int, cols: int):
    """What each merged image token (32 x 32 pixels after smart_resize, row-major) should know,
    as two class indices: what it holds (0 where no object's centre falls, else 1 + the shape and
    colour of the object centred there) and which ninth of the image that object is in (-100
    where there is none). The targets of the auxiliary loss that teaches the vision tower to see
    (training only)."""
    what = torch.zeros(rows * cols, dtype=torch.long)
    cell = torch.full((rows * cols,), -100, dtype=torch.long)
    for shape, colour, x, y, cx, cy in objects:
        i = min(int(cy * rows), rows - 1) * cols + min(int(cx * cols), cols - 1)
        what[i] = 1 + SHAPES.index(shape) * len(COLOURS) + list(COLOURS).index(colour)
        cell[i] = int(y * 3) * 3 + int(x * 3)
    return torch.stack([what, cell], 1)


def clip_token_classes(clip: Clip, rows: int, cols: int):
    """The video counterpart of token_classes, per temporal group (two sampled frames): what each
    merged token holds (the shape and colour of the object whose centre, averaged over the
    group's two frames, falls there) and which way that object moves (-100 where there is
    none)."""
    groups = len(clip.indices) // 2
    what = torch.zeros(groups, rows * cols, dtype=torch.long)
    way = torch.full((groups, rows * cols), -100, dtype=torch.long)
    for g in range(groups):
        a, b = clip.indices[2 * g], clip.indices[2 * g + 1]
        for o in clip.objects:
            if o["appear"] > a:
                continue
            (x0, y0, x1, y1), (u0, v0, u1, v1) = clip.box(o, a), clip.box(o, b)
            cx, cy = (x0 + x1 + u0 + u1) / 4 / clip.w, (y0 + y1 + v0 + v1) / 4 / clip.h
            i = min(int(cy * rows), rows - 1) * cols + min(int(cx * cols), cols - 1)
            what[g, i] = 1 + SHAPES.index(o["shape"]) * len(COLOURS) + list(COLOURS).index(o["colour"])
            way[g, i] = list(DIRECTIONS).index(o["direction"])
    return torch.stack([what.view(-1), way.view(-1)], 1)


def training_loss(model, probe, inputs):
    """The answers' cross-entropy, averaged over each answer's tokens and then over the answers,
    so that the long "Describe" answers weigh as much as the one-word ones (transformers' loss
    averages over all tokens); plus the auxiliary loss: a linear probe on the vision tower's
    merged tokens must tell what each token's 32 x 32 pixels hold and where in the image
    (token_classes). The probe is not part of the model and is not saved."""
    labels = inputs.pop("labels")[:, 1:]
    classes = inputs.pop("token_classes", None)
    vclasses = inputs.pop("video_token_classes", None)
    seen = []
    hook = model.model.visual.merger.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        logits = model(**inputs).logits[:, :-1]
    finally:
        hook.remove()
    # transformers encodes the images, then the videos: one merger call each.
    aux = torch.zeros(())
    kinds = 1 + len(SHAPES) * len(COLOURS)
    if classes is not None:
        what, cell, _ = probe(seen.pop(0)).split([kinds, 9, len(DIRECTIONS)], dim=1)
        aux = aux + (torch.nn.functional.cross_entropy(what, classes[:, 0]) +
                     torch.nn.functional.cross_entropy(cell, classes[:, 1], ignore_index=-100))
    if vclasses is not None:
        what, _, way = probe(seen.pop(0)).split([kinds, 9, len(DIRECTIONS)], dim=1)
        aux = aux + (torch.nn.functional.cross_entropy(what, vclasses[:, 0]) +
                     torch.nn.functional.cross_entropy(way, vclasses[:, 1], ignore_index=-100))
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                           ignore_index=-100, reduction="none").view(labels.shape)
    weight = torch.zeros(labels.shape)
    for row, lab in zip(weight, (labels != -100).tolist()):
        start = None
        for j, on in enumerate(lab + [False]):  # each run of labelled tokens is one answer
            if on and start is None:
                start = j
            elif not on and start is not None:
                row[start:j] = 1.0 / (j - start)
                start = None
    return (ce * weight).sum() / weight.sum(), aux


def linear_patch_embed(embed):
    """The patch embedding's Conv3d (kernel = stride = the patch) as the matmul it is: the same
    weights and result, at half the training step's time (CPU Conv3d backward is slow)."""
    def forward(x):
        w = embed.proj.weight
        return torch.nn.functional.linear(x.view(-1, w[0].numel()).to(w.dtype), w.view(w.shape[0], -1),
                                          embed.proj.bias)
    embed.forward = forward


def sample_stream(seed: int, turns: int, clips: bool = False):
    """Scenes (or clips) with up to `turns` questions each, asked as one multi-turn chat."""
    rng = random.Random(seed)
    while True:
        if clips:
            clip = Clip(rng)
            yield clip, clip_questions(clip, rng)[:turns]
        else:
            img, objects = make_scene(rng)
            yield img, objects, questions(objects, rng)[:turns]


@torch.no_grad()
def answer(model, enc: Encoder, seen, question: str, max_new: int = 24) -> str:
    """transformers' greedy answer to a question about an image or a Clip."""
    if isinstance(seen, Clip):
        ids, pv, grid = enc.video(seen, question)
        extra = dict(pixel_values_videos=pv, video_grid_thw=grid)
    else:
        pv, grid = enc.image(seen)
        ids, _ = enc.ids(question, None, int(grid.prod()) // 4)
        extra = dict(pixel_values=pv, image_grid_thw=grid)
    inputs = enc.with_types(dict(input_ids=torch.tensor([ids]),
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long)))
    out = model.generate(**inputs, max_new_tokens=max_new, do_sample=False,
                         eos_token_id=enc.tok.token_to_id("<|im_end|>"),
                         pad_token_id=enc.tok.token_to_id("<|endoftext|>"), **extra)
    return enc.tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)


def kind(question: str) -> str:
    """The question's type, for per-type accuracy."""
    for prefix, name in [("Describe", "describe"), ("How many shapes appear", "appear"),
                         ("How many shapes", "count"), ("How many", "count-shape"),
                         ("What colour", "colour"), ("Where", "where"), ("Which way", "move"),
                         ("Which shape appears first", "first")]:
        if question.startswith(prefix):
            return name
    raise ValueError(question)


def evaluate(model, enc: Encoder, seed: int, n: int, clips: bool = False):
    """Held-out accuracy (exact answers) on scenes or clips, overall and per question type."""
    stream = sample_stream(seed, 1, clips)
    per = {}
    for _ in range(n):
        *seen, qas = next(stream)
        q, a = qas[0]
        r = per.setdefault(kind(q), [0, 0])
        r[0] += answer(model, enc, seen[0], q) == a
        r[1] += 1
    total = sum(r[0] for r in per.values()) / n
    return total, " ".join(f"{k} {r[0]}/{r[1]}" for k, r in sorted(per.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="where the trained model goes (required unless --load)")
    ap.add_argument("--init", type=Path,
                    help="start from this saved model (and its tokenizer) instead of from scratch")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--clips", type=int, default=0, help="of each batch, how many are clips")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--vocab", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-seed", type=int, default=777, help="held-out scenes (never trained on)")
    ap.add_argument("--eval-clip-seed", type=int, default=779, help="held-out clips")
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text-hidden", type=int, default=96)
    ap.add_argument("--vision-hidden", type=int, default=64)
    ap.add_argument("--vision-depth", type=int, default=2)
    ap.add_argument("--turns", type=int, default=8, help="questions per scene (one multi-turn chat)")
    ap.add_argument("--aux-weight", type=float, default=1.0,
                    help="weight of the vision tower's auxiliary loss (token_classes)")
    ap.add_argument("--fixture-out", type=Path, help="also write the CI fixture of scenes here")
    ap.add_argument("--fixture-seed", type=int, default=4242)
    ap.add_argument("--fixture-n", type=int, default=40)
    ap.add_argument("--clip-fixture-out", type=Path, help="also write the CI fixture of clips here")
    ap.add_argument("--clip-fixture-seed", type=int, default=4343)
    ap.add_argument("--example-out", type=Path, help="also write the README's example picture")
    ap.add_argument("--example-seed", type=int, default=2024)
    ap.add_argument("--clip-example-out", type=Path, help="also write the README's example clip")
    ap.add_argument("--clip-example-seed", type=int, default=2025)
    ap.add_argument("--load", type=Path, help="skip training: load this saved model")
    ap.add_argument("--arch", choices=["qwen3_5", "qwen3_vl"],
                    help="the architecture of a new model (default qwen3_5, which needs "
                         "transformers 5.x); --init and --load take the saved one's")
    ap.add_argument("--tower-from", type=Path,
                    help="from scratch, but with this trained model's tokenizer, vision tower "
                         "and token embeddings (copy_tower)")
    a = ap.parse_args()
    writes = (a.fixture_out, a.clip_fixture_out, a.example_out, a.clip_example_out)
    if (a.out is None) == (a.load is None) or (a.load is not None and
                                               all(w is None for w in writes)):
        ap.error("give --out DIR to train, or --load DIR with a fixture or example to write")
    if (a.init is not None or a.load is not None) and (a.arch is not None or a.tower_from is not None):
        ap.error("--arch and --tower-from make a new model: not with --init or --load")
    a.arch = a.arch or "qwen3_5"
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)

    if a.load is not None:
        write_outputs(a, a.load)
        return
    if a.init is not None:
        tok = Tokenizer.from_file(str(a.init / "tokenizer.json"))
        model = load_model(a.init)
    else:
        if a.tower_from is not None:
            tok = Tokenizer.from_file(str(a.tower_from / "tokenizer.json"))
        else:
            rng = random.Random(a.seed + 1)
            texts = []
            for _ in range(3000):
                _, objects = make_scene(rng)
                texts += [chat(q, x) for q, x in questions(objects, rng)]
            tok = train_tokenizer(texts, a.vocab)
        model = model_class(a.arch)(
            make_config(tok, a.arch, a.text_hidden, a.vision_hidden, a.vision_depth))
        if a.tower_from is not None:
            copy_tower(model, a.tower_from)
    model.train()
    linear_patch_embed(model.model.visual.patch_embed)
    enc = Encoder(tok, model.config.model_type)
    hidden = model.config.text_config.hidden_size
    print(f"params {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M, vocab {tok.get_vocab_size()}")
    probe = torch.nn.Linear(hidden, 1 + len(SHAPES) * len(COLOURS) + 9 + len(DIRECTIONS))
    params = list(model.parameters()) + list(probe.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.01)
    scenes, clips = sample_stream(a.seed, a.turns), sample_stream(a.seed + 2, a.turns, True)
    t0 = time.time()
    for step in range(1, a.steps + 1):
        lr = a.lr * min(1.0, step / a.warmup) * 0.5 * (1 + math.cos(math.pi * step / a.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        samples = ([next(scenes) for _ in range(a.batch - a.clips)] +
                   [next(clips) for _ in range(a.clips)])
        loss, aux = training_loss(model, probe, batch(enc, samples))
        opt.zero_grad()
        (loss + a.aux_weight * aux).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 100 == 0 or step == a.steps:
            print(f"step {step} loss {loss.item():.4f} aux {aux.item():.4f} lr {lr:.2e} "
                  f"{time.time() - t0:.0f}s", flush=True)
        if step % a.eval_every == 0 or step == a.steps:
            model.eval()
            acc, detail = evaluate(model, enc, a.eval_seed, 200)
            print(f"  held-out accuracy {acc:.3f} ({detail})", flush=True)
            if a.clips:
                acc, detail = evaluate(model, enc, a.eval_clip_seed, 200, clips=True)
                print(f"  held-out clip accuracy {acc:.3f} ({detail})", flush=True)
            model.train()
    save(model, tok, a.out)
    write_outputs(a, a.out)  # from the saved files, with transformers' own modules


def write_outputs(a, model_dir: Path) -> None:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = load_model(model_dir)
    model.eval()
    enc = Encoder(tok, model.config.model_type)
    cases = f"cases-{model_dir.resolve().name}.json"  # one per model; the files are shared
    if a.fixture_out is not None:
        write_fixture(model, enc, a.fixture_out / cases, a.fixture_seed, a.fixture_n)
    if a.clip_fixture_out is not None:
        write_clip_fixture(model, enc, a.clip_fixture_out / cases, a.clip_fixture_seed, a.fixture_n)
    if a.example_out is not None:
        write_example(model, enc, a.example_out, a.example_seed)
    if a.clip_example_out is not None:
        write_clip_example(model, enc, a.clip_example_out, a.clip_example_seed)


def save(model, tok: Tokenizer, out: Path) -> None:
    """save_pretrained in the published layout, plus the tokenizer and processor files."""
    out.mkdir(parents=True, exist_ok=True)
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    model.generation_config.eos_token_id = [im_end, eot]
    model.generation_config.pad_token_id = eot
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    tok.save(str(out / "tokenizer.json"))
    template = (REPO / "tests/model/fixtures/chat_template/chat_template.jinja").read_text()
    added = {str(tok.token_to_id(t)): dict(content=t, lstrip=False, normalized=False, rstrip=False,
                                          single_word=False, special=True) for t in SPECIAL}
    (out / "tokenizer_config.json").write_text(json.dumps(dict(
        add_bos_token=False, add_prefix_space=False, added_tokens_decoder=added,
        bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
        model_max_length=4096, tokenizer_class="PreTrainedTokenizerFast",
        chat_template=template, clean_up_tokenization_spaces=False), indent=2) + "\n")
    (out / "preprocessor_config.json").write_text(json.dumps(dict(
        PROCESSOR, processor_class="Qwen3VLProcessor",
        image_processor_type="Qwen2VLImageProcessorFast"), indent=2) + "\n")
    (out / "video_preprocessor_config.json").write_text(json.dumps(dict(
        VIDEO_PROCESSOR, processor_class="Qwen3VLProcessor",
        video_processor_type="Qwen3VLVideoProcessor"), indent=2) + "\n")


def write_example(model, enc: Encoder, out: Path, seed: int) -> None:
    """The README's example picture: the first scene (from `seed`, never trained on) with three
    or more shapes about which transformers answers every question right; its questions and
    true answers go beside it (same name, .json) for the CLI test."""
    rng = random.Random(seed)
    while True:
        img, objects = make_scene(rng)
        qas = questions(objects, rng)
        if len(objects) < 3:
            continue
        img.save(out, format="PNG", optimize=True)
        with Image.open(out) as f:
            got = [answer(model, enc, f.convert("RGB"), q) for q, _ in qas]
        if all(g == a for g, (_, a) in zip(got, qas)):
            break
    write_questions(out, qas)


def write_questions(out: Path, qas) -> None:
    out.with_suffix(".json").write_text(json.dumps(
        [dict(question=q, answer=a) for q, a in qas], indent=1) + "\n")
    for q, a in qas:
        print(f"{out}: {q} -> {a}")


def write_gif(clip: Clip, out: Path) -> None:
    """The clip as an animated GIF (lossless for these few colours), checked by decoding it back
    with PyAV, as transformers' read_video_pyav does: the frame count and rate it reports must be
    the clip's and the frames at the sampled indices must be the rendered ones, pixel for pixel."""
    import av
    frames = [clip.frame(i) for i in range(clip.total)]
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:],
                   duration=1000 // clip.fps, loop=0)
    with av.open(str(out)) as c:
        s = c.streams.video[0]
        assert (int(s.frames), float(s.average_rate)) == (clip.total, clip.fps), (out, s.frames, s.average_rate)
        got = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(got) == clip.total, out
    for i in clip.indices:
        assert np.array_equal(got[i], np.asarray(frames[i])), (out, i)


def write_clip_example(model, enc: Encoder, out: Path, seed: int) -> None:
    """The README's example clip: the first clip (from `seed`) with three shapes about which
    transformers answers every question right; its questions and true answers beside it."""
    rng = random.Random(seed)
    while True:
        clip = Clip(rng)
        qas = clip_questions(clip, rng)
        if len(clip.objects) == 3 and all(answer(model, enc, clip, q) == a for q, a in qas):
            break
    write_gif(clip, out)
    write_questions(out, qas)


def write_fixture(model, enc: Encoder, cases_file: Path, seed: int, n: int) -> None:
    """Held-out scenes (a seed training never used) as PNG files beside `cases_file`, one
    question each, with the true answer and transformers' greedy answer: the CI test asks vlm the
    same questions. The scenes depend on the seed alone, so every model's cases share them."""
    out = cases_file.parent
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    cases, right = [], 0
    for i in range(n):
        img, objects = make_scene(rng)
        q, truth = questions(objects, rng)[0]
        name = f"scene_{i:02d}.png"
        img.save(out / name, format="PNG", optimize=True)
        with Image.open(out / name) as f:  # exactly what vlm will read
            got = answer(model, enc, f.convert("RGB"), q)
        right += got == truth
        cases.append(dict(image=name, question=q, truth=truth, transformers=got))
    write_cases(cases_file, seed, cases, right, "scenes")


def write_cases(cases_file: Path, seed: int, cases, right: int, items: str) -> None:
    """A fixture's cases file: its cases, transformers' accuracy over them and the versions."""
    n = len(cases)
    cases_file.write_text(json.dumps(dict(
        seed=seed, transformers_accuracy=right / n, transformers_version=transformers.__version__,
        torch_version=torch.__version__, cases=cases), indent=1) + "\n")
    print(f"fixture: {n} {items}, transformers accuracy {right / n:.3f}")


def write_clip_fixture(model, enc: Encoder, cases_file: Path, seed: int, n: int) -> None:
    """Held-out clips (a seed training never used) as GIF files beside `cases_file` (write_gif:
    decoded back, they are the frames answered here), one question each, with the true answer and
    transformers' greedy answer: the CI test asks `vlm run --video` the same questions."""
    out = cases_file.parent
    out.mkdir(parents=True, exist_ok=True)
    stream = sample_stream(seed, 1, clips=True)
    cases, right = [], 0
    for i in range(n):
        clip, ((q, truth),) = next(stream)
        name = f"clip_{i:03d}.gif"
        write_gif(clip, out / name)
        got = answer(model, enc, clip, q)
        right += got == truth
        cases.append(dict(video=name, question=q, truth=truth, transformers=got))
    write_cases(cases_file, seed, cases, right, "clips")


if __name__ == "__main__":
    main()
