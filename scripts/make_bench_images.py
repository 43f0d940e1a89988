#!/usr/bin/env python3
"""Make the two standard benchmark images (JPEG) from the test photos.

  BENCH_VENV/bin/python scripts/make_bench_images.py --out BENCH_IMAGES

writes astronaut_448x448.jpg (astronaut_eileen_collins.png, 512×512, resized) and
retina_1280x960.jpg (retina_2560x1600.jpg, centre-cropped to 4:3, resized), both baseline JPEG,
quality 90, 4:2:0, from tests/data/images (--images to change). Both
sizes are multiples of 32, so Qwen3-VL's default resize keeps them: 196 and 1200 vision tokens.
These are the files `vlm bench --image` and scripts/compare_llamacpp.py take when both engines
must read the same JPEG; `vlm bench --synthetic-image 448x448` needs no file at all (a generated
BMP: same vision-encoder cost, cheaper to decode). Needs Pillow (scripts/requirements-bench.txt).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from PIL import Image

# (output name, source photo, size)
IMAGES = [
    ("astronaut_448x448.jpg", "astronaut_eileen_collins.png", (448, 448)),
    ("retina_1280x960.jpg", "retina_2560x1600.jpg", (1280, 960)),
]


def centre_crop(im: Image.Image, aspect: float) -> Image.Image:
    w, h = im.size
    if w / h > aspect:
        cw = round(h * aspect)
        return im.crop(((w - cw) // 2, 0, (w - cw) // 2 + cw, h))
    ch = round(w / aspect)
    return im.crop((0, (h - ch) // 2, w, (h - ch) // 2 + ch))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    repo = Path(__file__).resolve().parent.parent
    ap.add_argument("--images", type=Path, default=repo / "tests" / "data" / "images")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for name, src, size in IMAGES:
        im = Image.open(a.images / src).convert("RGB")
        im = centre_crop(im, size[0] / size[1]).resize(size, Image.Resampling.LANCZOS)
        im.save(a.out / name, "JPEG", quality=90, subsampling="4:2:0")
        print(f"{a.out / name}: {size[0]}x{size[1]}")


if __name__ == "__main__":
    main()
