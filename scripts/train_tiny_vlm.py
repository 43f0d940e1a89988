#!/usr/bin/env python3
"""Trains the tiny Qwen3-VL that learns to answer questions about synthetic shape images (issue 6).

Everything is generated here: images of 1-5 coloured shapes on plain backgrounds, chat-formatted
questions and answers about them, a byte-level BPE tokenizer (the `tokenizers` library, with
Qwen's pre-tokenizer and special-token strings, so vlm loads it through the same tokenizer.json
path as the real one), and a Qwen3VLForConditionalGeneration of the real architecture at a tiny
size, trained on the CPU.

  python scripts/train_tiny_vlm.py --out DIR --steps 7000 --lr 3e-3 --batch 32 --per-image 1 \
      --text-hidden 128 --vision-hidden 96 [--fixture-out DIR]
  python scripts/train_tiny_vlm.py --load DIR --fixture-out DIR    # the CI fixture only

--fixture-out writes held-out scenes (a seed training never used) as PNG files with one question
each, the true answer and transformers' greedy answer. Needs torch, transformers, tokenizers and
Pillow (scripts/requirements-reference.txt); CI never runs it.

Status (issue 6 open): the pipeline runs end to end and vlm loads what it saves, but the model
does not learn to see well enough yet. Held-out accuracy (one question per scene, all question
types) was 26% / 29% after 1000 / 3000 steps (0.96 M parameters, batch 16, lr 3e-3), and 24% /
27% after 1000 / 2000 steps (1.7 M parameters, batch 32, 96–160 px scenes). Per type after 3000
steps: "How many X" 38%, "How many shapes" 33%, colour 23% (chance 17%), position 10%,
"Describe" 3%. The second setting (the command above, 7000 steps, 33 min on 2 cores) reached 42%
held-out (33% / 34% / 38% / 41% at 3000 / 4000 / 5000 / 6000 steps); per type: "How many
shapes" 75%, colour 65%, "How many X" 45%, "Describe" 20%, position 15% — still climbing. Even scenes of a single shape with only the colour question stay at chance loss
for ~250 steps before the vision path starts to carry the colour. What already holds: with the
3000-step model saved by save() and 20 held-out scenes from --fixture-out, `vlm run --greedy`
gave transformers' answer to all 20 (trained BPE tokenizer, chat template, the 4–25 × 32² pixel
budget of preprocessor_config.json, vision tower and decoder).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import transformers
from PIL import Image, ImageDraw
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2VLImageProcessorFast, Qwen3VLConfig, Qwen3VLForConditionalGeneration

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
    """An image and its objects: [(shape, colour, centre x / width, centre y / height)]."""
    w, h = rng.choice([96, 112, 128, 144, 160]), rng.choice([96, 112, 128, 144, 160])
    bg = rng.choice(BACKGROUNDS)
    img = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(img)
    n = rng.randint(1, 5)
    size = max(16, min(w, h) // rng.choice([4, 5]))
    objects, boxes = [], []
    for _ in range(n):
        for _try in range(50):
            s = int(size * rng.uniform(0.8, 1.2))
            x0, y0 = rng.randint(0, w - s), rng.randint(0, h - s)
            box = (x0, y0, x0 + s, y0 + s)
            if all(box[2] + 4 <= b[0] or b[2] + 4 <= box[0] or box[3] + 4 <= b[1] or
                   b[3] + 4 <= box[1] for b in boxes):
                break
        else:
            continue
        shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
        draw_shape(d, shape, box, COLOURS[colour])
        boxes.append(box)
        objects.append((shape, colour, (box[0] + box[2]) / 2 / w, (box[1] + box[3]) / 2 / h))
    return img, objects


def plural(shape: str, n: int) -> str:
    return shape if n == 1 else shape + "s"


def describe(objects) -> str:
    groups = {}
    for shape, colour, _, _ in objects:
        groups[(colour, shape)] = groups.get((colour, shape), 0) + 1
    parts = [f"{NUMBERS[n]} {colour} {plural(shape, n)}" for (colour, shape), n in sorted(groups.items())]
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


def chat(question: str, answer: str | None) -> str:
    """The Qwen3-VL Instruct template's rendering of one user turn (image first) and the answer."""
    s = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>" + question +
         "<|im_end|>\n<|im_start|>assistant\n")
    return s if answer is None else s + answer + "<|im_end|>\n"


# ----------------------------------------------------------------------------------------------
# model and training
# ----------------------------------------------------------------------------------------------

def make_config(tok: Tokenizer, text_hidden: int = 96, vision_hidden: int = 64,
                vision_depth: int = 2) -> Qwen3VLConfig:
    ids = {t: tok.token_to_id(t) for t in SPECIAL}
    return Qwen3VLConfig(
        text_config=dict(vocab_size=tok.get_vocab_size(), hidden_size=text_hidden,
                         intermediate_size=text_hidden * 8 // 3 // 32 * 32,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=4096,
                         rope_theta=5e6, tie_word_embeddings=True,
                         rope_scaling={"rope_type": "default", "mrope_section": [8, 4, 4],
                                       "mrope_interleaved": True},
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"]),
        vision_config=dict(depth=vision_depth, hidden_size=vision_hidden, num_heads=4,
                           intermediate_size=2 * vision_hidden, patch_size=16,
                           temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                           hidden_act="gelu_pytorch_tanh", out_hidden_size=text_hidden,
                           num_position_embeddings=2304,
                           deepstack_visual_indexes=list(range(min(vision_depth, 3)))),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True)


class Encoder:
    """Turns (image, question, answer) into model inputs: the image's pixel values and grid, and
    ids with <|image_pad|> repeated once per merged patch; labels only on the answer + <|im_end|>."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.proc = Qwen2VLImageProcessorFast(**PROCESSOR)
        self.pad = tok.token_to_id("<|image_pad|>")

    def image(self, img: Image.Image):
        out = self.proc(images=[img], min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
                        return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]

    def ids(self, question: str, answer: str | None, n_pads: int):
        prompt = self.tok.encode(chat(question, None)).ids
        i = prompt.index(self.pad)
        prompt = prompt[:i] + [self.pad] * n_pads + prompt[i + 1:]
        if answer is None:
            return prompt, None
        full = self.tok.encode(answer + "<|im_end|>").ids
        return prompt + full, [-100] * len(prompt) + full


def batch(enc: Encoder, samples):
    pixel, grids, seqs, labels = [], [], [], []
    for img, q, a in samples:
        pv, grid = enc.image(img)
        ids, lab = enc.ids(q, a, int(grid.prod()) // 4)
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
    return dict(input_ids=input_ids, attention_mask=attn, labels=lab,
                pixel_values=torch.cat(pixel), image_grid_thw=torch.cat(grids))


def sample_stream(seed: int, per_image: int):
    rng = random.Random(seed)
    while True:
        img, objects = make_scene(rng)
        for q, a in questions(objects, rng)[:per_image]:
            yield img, q, a


@torch.no_grad()
def answer(model, enc: Encoder, img, question: str, max_new: int = 24) -> str:
    pv, grid = enc.image(img)
    ids, _ = enc.ids(question, None, int(grid.prod()) // 4)
    out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         pixel_values=pv, image_grid_thw=grid, max_new_tokens=max_new,
                         do_sample=False, eos_token_id=enc.tok.token_to_id("<|im_end|>"),
                         pad_token_id=enc.tok.token_to_id("<|endoftext|>"))
    return enc.tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)


def evaluate(model, enc: Encoder, seed: int, n: int):
    rng = random.Random(seed)
    right, total = 0, 0
    for _ in range(n):
        img, objects = make_scene(rng)
        q, a = questions(objects, rng)[0]
        right += answer(model, enc, img, q) == a
        total += 1
    return right / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="where the trained model goes (required unless --load)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--vocab", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-seed", type=int, default=777, help="held-out scenes (never trained on)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text-hidden", type=int, default=96)
    ap.add_argument("--vision-hidden", type=int, default=64)
    ap.add_argument("--vision-depth", type=int, default=2)
    ap.add_argument("--per-image", type=int, default=2, help="questions per scene in a batch")
    ap.add_argument("--fixture-out", type=Path, help="also write the CI fixture here")
    ap.add_argument("--fixture-seed", type=int, default=4242)
    ap.add_argument("--fixture-n", type=int, default=40)
    ap.add_argument("--load", type=Path, help="skip training: load this saved model")
    a = ap.parse_args()
    if (a.out is None) == (a.load is None) or (a.load is not None and a.fixture_out is None):
        ap.error("give --out DIR to train, or --load DIR --fixture-out DIR")
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)

    if a.load is not None:
        tok = Tokenizer.from_file(str(a.load / "tokenizer.json"))
        model = Qwen3VLForConditionalGeneration.from_pretrained(a.load)
        write_fixture(model, Encoder(tok), a.fixture_out, a.fixture_seed, a.fixture_n)
        return
    rng = random.Random(a.seed + 1)
    texts = []
    for _ in range(3000):
        _, objects = make_scene(rng)
        texts += [chat(q, x) for q, x in questions(objects, rng)]
    tok = train_tokenizer(texts, a.vocab)
    model = Qwen3VLForConditionalGeneration(
        make_config(tok, a.text_hidden, a.vision_hidden, a.vision_depth))
    model.train()
    enc = Encoder(tok)
    print(f"params {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M, vocab {tok.get_vocab_size()}")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    stream = sample_stream(a.seed, a.per_image)
    t0 = time.time()
    for step in range(1, a.steps + 1):
        lr = a.lr * min(1.0, step / 100) * 0.5 * (1 + math.cos(math.pi * step / a.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = model(**batch(enc, [next(stream) for _ in range(a.batch)])).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == a.steps:
            print(f"step {step} loss {loss.item():.4f} lr {lr:.2e} {time.time() - t0:.0f}s", flush=True)
        if step % 1000 == 0 or step == a.steps:
            model.eval()
            print(f"  held-out accuracy {evaluate(model, enc, a.eval_seed, 100):.3f}", flush=True)
            model.train()
    save(model, tok, a.out)
    if a.fixture_out is not None:
        write_fixture(model, enc, a.fixture_out, a.fixture_seed, a.fixture_n)


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


def write_fixture(model, enc: Encoder, out: Path, seed: int, n: int) -> None:
    """Held-out scenes (a seed training never used) as PNG files, one question each, with the
    true answer and transformers' greedy answer: the CI test asks vlm the same questions."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    model.eval()
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
    (out / "cases.json").write_text(json.dumps(dict(
        seed=seed, transformers_accuracy=right / n, transformers_version=transformers.__version__,
        torch_version=torch.__version__, cases=cases), indent=1) + "\n")
    print(f"fixture: {n} scenes, transformers accuracy {right / n:.3f}")


if __name__ == "__main__":
    main()
