#!/usr/bin/env python3
"""Build tests/unit/fixtures/preprocess/: Qwen3-VL image preprocessing goldens from transformers.

The reference is transformers' default image processor for Qwen3-VL, ``Qwen2VLImageProcessorFast``,
constructed exactly as the checkpoints' preprocessor_config.json implies (size = {shortest_edge:
65536, longest_edge: 16777216} in PIXELS, patch 16, temporal patch 2, merge 2, mean = std = 0.5;
resample BICUBIC, rescale 1/255, fused rescale+normalise), with the (min, max) pixel budget
overridden per case through ``size`` (the one spelling every transformers path honours; passing
only one of min_pixels/max_pixels at call time is silently ignored by 4.57.1).

What it writes (everything deterministic for pinned versions; nothing is downloaded):

* ``src_<name>.npy`` ('|u1' [h, w, 3]): the source pixels of each synthetic case (smooth gradients
  plus seeded noise, so that resampling has something to get wrong).
* ``resized_<name>.npy`` ('|u1' [H, W, 3]): the RESIZED uint8 image the processor produced,
  recovered from ``pixel_values`` by undoing the permute and the normalisation. The recovery is
  checked to be exact (re-normalising it reproduces pixel_values bit for bit, and it equals
  torchvision's F.resize output).
* ``pixel_values_<name>.npy`` ('<f4' [grid_t*grid_h*grid_w, 1536]): the full processor output, for
  one small case only (to pin the flattening order and the float expression of the normalise).
* ``cases.json``: every case (source, budget, transformers' sizes, grid, token count, files),
  a smart_resize table (transformers' function vs our clamp rule) and constant-image cases run at
  the default budget for large/odd sizes whose pixels are not worth storing.

Tiny images: transformers 4.57.1's smart_resize does not raise for sides < 32; a side <= 16 rounds
to 0 (16/32 = 0.5 rounds to even) and the image then takes the min_pixels branch. vlm instead
clamps the rounded sides to >= factor first (qwen-vl-utils' rule, which the model was trained
with). The two agree except when a side <= factor/2 and factor * (other side) >= min_pixels;
such cases are recorded with both
answers and their pixels are taken from torchvision's resize at vlm's size.

The 8 test photos (tests/data/images) are referenced by path; their PIL-decoded bytes are
fingerprinted (FNV-1a 64) so the C++ test can tell a decoder difference from a resize difference.

Usage: python scripts/make_preprocess_reference.py
"""

import json
import math
import os
import sys

import numpy as np
import PIL
import torch
import torchvision
import transformers
from PIL import Image
from torchvision.transforms.v2 import functional as F
from transformers import Qwen2VLImageProcessorFast
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as hf_smart_resize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "unit", "fixtures", "preprocess")
PHOTO_DIR = os.path.join(ROOT, "tests", "data", "images")

PATCH, TEMPORAL, MERGE = 16, 2, 2
FACTOR = PATCH * MERGE
DEFAULT_MIN, DEFAULT_MAX = 65536, 16777216
SIZE_LIMIT_BYTES = 1_500_000


def make_processor(min_pixels, max_pixels):
    return Qwen2VLImageProcessorFast(
        patch_size=PATCH, temporal_patch_size=TEMPORAL, merge_size=MERGE,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels})


def vlm_smart_resize(h, w, factor, min_pixels, max_pixels):
    """transformers' smart_resize with qwen-vl-utils' clamp of the rounded sides to >= factor."""
    if max(h, w) / min(h, w) > 200:
        raise ValueError("aspect")
    h_bar = max(factor, round(h / factor) * factor)
    w_bar = max(factor, round(w / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((h * w) / max_pixels)
        h_bar = max(factor, math.floor(h / beta / factor) * factor)
        w_bar = max(factor, math.floor(w / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        h_bar = math.ceil(h * beta / factor) * factor
        w_bar = math.ceil(w * beta / factor) * factor
    return h_bar, w_bar


def synthetic(h, w, seed):
    """Smooth colour gradients plus a little structure and seeded noise, uint8 [h, w, 3]."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, h)[:, None]
    x = np.linspace(0.0, 1.0, w)[None, :]
    r = 255 * (0.15 + 0.7 * x)
    g = 255 * (0.5 + 0.4 * np.sin(6.0 * y + 3.0 * x))
    b = 255 * (0.9 - 0.6 * x * y)
    img = np.stack([r + 0 * y, g, b + 0 * y], axis=-1)
    img += rng.normal(0.0, 18.0, img.shape)
    # A few hard edges (a bright box), which bicubic turns into overshoot that must clip.
    img[h // 4: h // 4 + max(1, h // 5), w // 3: w // 3 + max(1, w // 6), :] = 250
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def fnv1a64(data: bytes) -> str:
    hv = 0xCBF29CE484222325
    for byte in data:
        hv ^= byte
        hv = (hv * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{hv:016x}"


def unflatten(pixel_values, grid_t, grid_h, grid_w):
    """pixel_values [gt*gh*gw, C*T*P*P] (merge order) -> frames [gt*T, C, H, W]."""
    p = pixel_values.reshape(grid_t, grid_h // MERGE, grid_w // MERGE, MERGE, MERGE, 3, TEMPORAL,
                             PATCH, PATCH)
    # (t, bh, bw, ih, iw, c, tt, py, px) -> (t, tt, c, bh, ih, py, bw, iw, px)
    p = p.permute(0, 6, 5, 1, 3, 7, 2, 4, 8)
    return p.reshape(grid_t * TEMPORAL, 3, grid_h * PATCH, grid_w * PATCH)


def run_processor(img_hwc, min_pixels, max_pixels):
    proc = make_processor(min_pixels, max_pixels)
    out = proc(images=Image.fromarray(img_hwc, "RGB"), return_tensors="pt")
    pv = out["pixel_values"]
    t, gh, gw = (int(v) for v in out["image_grid_thw"][0])
    frames = unflatten(pv, t, gh, gw)
    assert torch.equal(frames[0], frames[1]), "temporal copies differ"
    # The fused normalise is (x - 127.5) / 127.5 in float32; invert and check exactly.
    u8 = torch.round(frames[0] * 127.5 + 127.5)
    assert u8.min() >= 0 and u8.max() <= 255
    u8 = u8.to(torch.uint8)
    renorm = (u8.to(torch.float32) - 127.5) / 127.5
    assert torch.equal(renorm, frames[0]), "recovered uint8 does not re-normalise exactly"
    # Same pixels as calling torchvision's resize directly (what the processor does inside).
    chw = torch.from_numpy(np.ascontiguousarray(img_hwc.transpose(2, 0, 1)))
    direct = F.resize(chw, [gh * PATCH, gw * PATCH], interpolation=F.InterpolationMode.BICUBIC,
                      antialias=True)
    assert torch.equal(direct, u8), "processor pixels differ from F.resize"
    return pv.numpy(), (t, gh, gw), u8.permute(1, 2, 0).contiguous().numpy()


def torchvision_resize(img_hwc, out_h, out_w):
    chw = torch.from_numpy(np.ascontiguousarray(img_hwc.transpose(2, 0, 1)))
    r = F.resize(chw, [out_h, out_w], interpolation=F.InterpolationMode.BICUBIC, antialias=True)
    return r.permute(1, 2, 0).contiguous().numpy()


# (name, (h, w) or photo file, min_pixels, max_pixels, store pixel_values, why)
SYNTHETIC = [
    ("tiny_20x30", (20, 30), 16384, DEFAULT_MAX, False, "tiny image, min_pixels upscaling 5x"),
    ("tiny_1x1", (1, 1), 4096, DEFAULT_MAX, False, "1x1 source, every output pixel is the source"),
    ("thin_10x600", (10, 600), 4096, DEFAULT_MAX, False,
     "side < 16: transformers rounds it to 0 and gives 32x512; vlm clamps to 32x608"),
    ("aspect40_16x640", (16, 640), 4096, DEFAULT_MAX, False, "1:40 aspect, min_pixels branch"),
    ("round_both_100x150", (100, 150), 1024, DEFAULT_MAX, False,
     "rounding only: height rounds down (100->96), width up (150->160)"),
    ("tie_80x112", (80, 112), 1024, DEFAULT_MAX, False,
     "2.5 and 3.5 factors: half-to-even gives 64x128 (std::round would give 96x128)"),
    ("upscale_40x50", (40, 50), 8192, DEFAULT_MAX, False, "min_pixels upscaling, both axes"),
    ("clampmax_48x800", (48, 800), 1024, 1024, False,
     "max_pixels branch where floor(h/beta) = 0 is clamped to 32 (h up 1.5x, w down 6.25x)"),
    ("vonly_60x64", (60, 64), 1024, DEFAULT_MAX, False, "only the vertical pass runs"),
    ("honly_64x70", (64, 70), 1024, DEFAULT_MAX, False, "only the horizontal pass runs"),
    ("noresize_64x96", (64, 96), 1024, DEFAULT_MAX, False, "already aligned: pixels pass through"),
    ("pv_70x100", (70, 100), 1024, DEFAULT_MAX, True,
     "full pixel_values stored (64x96: 2x3 merged blocks)"),
    ("down_120x200", (120, 200), 1024, 4096, False, "max_pixels branch, ~3x downscale"),
]

PHOTOS = [
    ("astronaut_eileen_collins.png", 4096, 16384),
    ("cat_chelsea.png", 4096, 8192),
    ("cat_chelsea.webp", 4096, 8192),
    ("coffee_cup.png", 4096, 8192),
    ("document_scan_page.png", 4096, 8192),
    ("document_screenshot.png", 4096, 16384),
    ("retina_2560x1600.jpg", 4096, 16384),
    ("rocket_falcon9.jpg", 4096, 8192),
]

# Processor runs on constant images at sizes whose pixels are not worth storing.
CONSTANT = [
    (1, 1, DEFAULT_MIN, DEFAULT_MAX), (20, 30, DEFAULT_MIN, DEFAULT_MAX),
    (32, 1280, DEFAULT_MIN, DEFAULT_MAX), (224, 224, DEFAULT_MIN, DEFAULT_MAX),
    (720, 1296, DEFAULT_MIN, DEFAULT_MAX), (1080, 1920, DEFAULT_MIN, DEFAULT_MAX),
    (600, 800, DEFAULT_MIN, DEFAULT_MAX), (480, 640, DEFAULT_MIN, DEFAULT_MAX),
    (1600, 2560, DEFAULT_MIN, DEFAULT_MAX), (1000, 1500, DEFAULT_MIN, DEFAULT_MAX),
    (1000, 1000, DEFAULT_MIN, 128 * 32 * 32), (5, 1000, DEFAULT_MIN, DEFAULT_MAX),
]

# smart_resize only (no pixels): transformers' function against vlm's rule.
SIZE_TABLE = [
    (1080, 1920, DEFAULT_MIN, DEFAULT_MAX), (600, 800, DEFAULT_MIN, DEFAULT_MAX),
    (480, 640, DEFAULT_MIN, DEFAULT_MAX), (224, 224, DEFAULT_MIN, DEFAULT_MAX),
    (3000, 4000, DEFAULT_MIN, DEFAULT_MAX), (6000, 8000, DEFAULT_MIN, DEFAULT_MAX),
    (720, 1296, DEFAULT_MIN, DEFAULT_MAX), (1600, 2560, DEFAULT_MIN, DEFAULT_MAX),
    (1, 1, DEFAULT_MIN, DEFAULT_MAX), (20, 30, DEFAULT_MIN, DEFAULT_MAX),
    (32, 1280, DEFAULT_MIN, DEFAULT_MAX), (10, 2000, DEFAULT_MIN, DEFAULT_MAX),
    (12, 2400, DEFAULT_MIN, DEFAULT_MAX), (10, 600, 4096, DEFAULT_MAX),
    (10, 600, 1, DEFAULT_MAX), (10, 600, 0, DEFAULT_MAX), (5, 5, 0, DEFAULT_MAX),
    (1000, 1000, DEFAULT_MIN, 128 * 32 * 32), (4000, 20, DEFAULT_MIN, DEFAULT_MAX),
    (10, 2010, DEFAULT_MIN, DEFAULT_MAX), (2010, 10, DEFAULT_MIN, DEFAULT_MAX),
    (100, 100, 4096, 1024), (8000, 8000, DEFAULT_MIN, 4096),
]


def save_npy(name, arr):
    np.save(os.path.join(OUT, name), arr, allow_pickle=False)
    return name


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".npy") or f == "cases.json":
            os.remove(os.path.join(OUT, f))

    cases = []
    for seed, (name, (h, w), mn, mx, store_pv, why) in enumerate(SYNTHETIC):
        img = synthetic(h, w, 1000 + seed)
        case = {"name": name, "why": why, "source": save_npy(f"src_{name}.npy", img),
                "height": h, "width": w, "min_pixels": mn, "max_pixels": mx}
        hf = hf_smart_resize(h, w, FACTOR, mn, mx)
        ours = vlm_smart_resize(h, w, FACTOR, mn, mx)
        case["transformers_resized"] = list(hf)
        case["resized"] = list(ours)
        if tuple(hf) == tuple(ours):
            pv, grid, resized = run_processor(img, mn, mx)
            case["reference"] = "Qwen2VLImageProcessorFast"
            if store_pv:
                case["pixel_values"] = save_npy(f"pixel_values_{name}.npy", pv.astype(np.float32))
        else:
            # vlm deliberately differs in size here; the pixels come from the same torchvision
            # resize the processor calls, at vlm's size.
            resized = torchvision_resize(img, *ours)
            grid = (1, ours[0] // PATCH, ours[1] // PATCH)
            case["reference"] = "torchvision.F.resize (vlm size differs from transformers)"
        assert resized.shape[:2] == tuple(ours)
        case["grid_thw"] = list(grid)
        case["num_tokens"] = grid[0] * grid[1] * grid[2] // (MERGE * MERGE)
        case["resized_npy"] = save_npy(f"resized_{name}.npy", resized)
        cases.append(case)

    for fname, mn, mx in PHOTOS:
        pil = Image.open(os.path.join(PHOTO_DIR, fname)).convert("RGB")
        img = np.asarray(pil, dtype=np.uint8)
        h, w = img.shape[:2]
        name = os.path.splitext(fname)[0] + "_" + os.path.splitext(fname)[1][1:]
        hf = hf_smart_resize(h, w, FACTOR, mn, mx)
        assert tuple(hf) == vlm_smart_resize(h, w, FACTOR, mn, mx)
        pv, grid, resized = run_processor(img, mn, mx)
        cases.append({
            "name": name, "why": "test photo, small pixel budget", "photo": fname,
            "source_fnv1a64": fnv1a64(img.tobytes()), "height": h, "width": w,
            "min_pixels": mn, "max_pixels": mx, "transformers_resized": list(hf),
            "resized": list(hf), "reference": "Qwen2VLImageProcessorFast",
            "grid_thw": list(grid), "num_tokens": grid[0] * grid[1] * grid[2] // 4,
            "resized_npy": save_npy(f"resized_{name}.npy", resized)})

    constant_cases = []
    for h, w, mn, mx in CONSTANT:
        value = (37, 128, 201)
        img = np.empty((h, w, 3), np.uint8)
        img[...] = value
        assert hf_smart_resize(h, w, FACTOR, mn, mx) == vlm_smart_resize(h, w, FACTOR, mn, mx)
        pv, grid, resized = run_processor(img, mn, mx)
        assert (resized == np.array(value, np.uint8)).all()
        # The float32 values the processor wrote, per channel (each column block is one channel).
        per_channel = pv.reshape(pv.shape[0], 3, -1)
        channel_values = [float(per_channel[0, c, 0]) for c in range(3)]
        for c in range(3):
            assert (per_channel[:, c, :] == per_channel[0, c, 0]).all()
        constant_cases.append({"height": h, "width": w, "min_pixels": mn, "max_pixels": mx,
                               "rgb": list(value), "resized": list(resized.shape[:2]),
                               "grid_thw": list(grid), "pixel_values_rows": pv.shape[0],
                               "pixel_values_cols": pv.shape[1],
                               "channel_values": channel_values})

    size_table = []
    for h, w, mn, mx in SIZE_TABLE:
        row = {"height": h, "width": w, "min_pixels": mn, "max_pixels": mx}
        try:
            row["transformers"] = list(hf_smart_resize(h, w, FACTOR, mn, mx))
        except ValueError as e:
            row["transformers_error"] = str(e)
        try:
            row["vlm"] = list(vlm_smart_resize(h, w, FACTOR, mn, mx))
        except ValueError:
            row["vlm_error"] = "aspect"
        size_table.append(row)

    doc = {
        "generator": "scripts/make_preprocess_reference.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "torchvision": torchvision.__version__, "Pillow": PIL.__version__,
                     "numpy": np.__version__},
        "processor": {"class": "Qwen2VLImageProcessorFast", "patch_size": PATCH,
                      "temporal_patch_size": TEMPORAL, "merge_size": MERGE,
                      "image_mean": [0.5] * 3, "image_std": [0.5] * 3},
        "cases": cases, "constant_cases": constant_cases, "smart_resize_table": size_table,
    }
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")

    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"{len(cases)} cases, {len(constant_cases)} constant cases, {len(size_table)} size rows; "
          f"{total} bytes in {OUT}")
    if total > SIZE_LIMIT_BYTES:
        sys.exit(f"fixtures are {total} bytes, over the {SIZE_LIMIT_BYTES} budget")


if __name__ == "__main__":
    main()
