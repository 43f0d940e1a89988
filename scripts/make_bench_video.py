#!/usr/bin/env python3
"""Make the standard benchmark video: an H.264 MP4 of moving shapes over a textured background.

  BENCH_VENV/bin/python scripts/make_bench_video.py --out BENCH_DIR

writes shapes_1280x720_30fps_10s.mp4: 300 frames at 30 fps, 1280x720, yuv420p, H.264 (libx264,
CRF 23, a keyframe every 60 frames), the kind of clip a phone records. `vlm bench --video FILE
--video-frames 8,32,128` samples it at those frame counts (all below the 300 it holds). The
texture is a fixed noise pattern that moves with the camera, so that the frames are not trivially
compressible. Needs PyAV and numpy (scripts/requirements-bench.txt).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import av
import numpy as np

W, H, FPS, SECONDS = 1280, 720, 30, 10


def frame(i: int, texture: np.ndarray) -> np.ndarray:
    x0 = (i * 3) % (texture.shape[1] - W)
    img = texture[:H, x0:x0 + W].copy()
    t = i / FPS
    yy, xx = np.mgrid[0:H, 0:W]
    # A red circle moving right, a blue square moving down, a green bar sweeping.
    cx, cy = int(100 + 100 * t), 360
    img[(xx - cx) ** 2 + (yy - cy) ** 2 < 80 ** 2] = (220, 40, 40)
    sx, sy = 900, int(60 + 50 * t)
    img[sy:sy + 120, sx:sx + 120] = (40, 60, 220)
    bx = int((t / SECONDS) * (W - 40))
    img[600:680, bx:bx + 40] = (40, 200, 60)
    return img


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    base = rng.integers(60, 196, size=(H // 8, (W + 3 * FPS * SECONDS) // 8 + 1, 3), dtype=np.uint8)
    texture = np.repeat(np.repeat(base, 8, axis=0), 8, axis=1)
    path = args.out / f"shapes_{W}x{H}_{FPS}fps_{SECONDS}s.mp4"
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=FPS)
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        s.options = {"crf": "23", "g": "60", "preset": "veryfast"}
        for i in range(FPS * SECONDS):
            for p in s.encode(av.VideoFrame.from_ndarray(frame(i, texture), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    print(path, path.stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
