#!/usr/bin/env python3
"""Build the video-decoding fixtures in tests/unit/fixtures/videos/ and their references.

What it writes (small clips of moving shapes, 64x48, made here with PyAV's encoders):

* mp4_h264_2997.mp4  H.264 in MP4 at 30000/1001 fps, 45 frames (the header states the count)
* mp4_h264_70x46.mp4  H.264 at 12 fps, 10 frames 70x46 (a width no vector path divides)
* mov_h264_single.mov  one H.264 frame in MOV
* webm_vp9_7.webm    VP9 in WebM at 7 fps, 20 frames (no count in the header)
* mkv_vp8_vfr.mkv    VP8 in Matroska with a variable frame rate, 16 frames
* gif_10.gif         an animated GIF at 10 fps, 12 frames
* webp_anim.webp     an animated WebP (Pillow), 10 frames of 100 ms
* hostile files: truncated_mp4.mp4 (the first 40% of the MP4), garbage.mp4, zero_frames.mp4 (a
  container with a video stream and no packets), huge_header.webp (a 60000x60000 canvas),
  huge_header.gif (a 65535x65535 screen), long_header.mkv (a 10-hour duration stated),
  wrong_extension.mp4 (the WebM's bytes), playlist.m3u8 and concat.txt (an HLS playlist and a
  concat list naming a local file and a URL: never opened).
* reference.json's timestamps and groups per clip: the "<t.t seconds>" texts Qwen3VLProcessor
  puts in the prompt (read back from its ids).
* pre_<clip>.npy and reference.json's preprocess_cases: Qwen3VLVideoProcessor's pixel_values_videos
  and video_grid_thw over the sampled frames at three pixel budgets (see main()).
* reference.json: per clip, what transformers 4.57.1's PyAV reader gives (read_video_pyav with
  Qwen3VLVideoProcessor.sample_frames at its defaults: fps 2, 4..768 frames): the metadata
  (frame count, fps), the sampled indices; and <clip>.npy, those frames as PyAV's
  to_ndarray(format="rgb24") gives them, [n, h, w, 3] uint8. Where the header states no frame
  count (WebM, MKV) transformers samples nothing; vlm counts the stream's packets (one per
  frame) and the script records the frames at the indices that gives ("count_from":
  "packets"), so the decoders are still compared frame for frame. WebP has no PyAV reader:
  Pillow's frames at vlm's indices (count / duration as the rate).

Usage (a venv with scripts/requirements-reference.txt and av==15.1.0):
    python scripts/make_video_fixtures.py

Fixed drawings and encoder settings; the H.264, GIF and WebP bytes repeat between runs, libvpx's
may not, and every reference is recomputed from the bytes written.
"""

from __future__ import annotations

import io
import json
import sys
import math
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw

OUT = Path(__file__).resolve().parent.parent / "tests" / "unit" / "fixtures" / "videos"
W, H = 64, 48


def frame_rgb(i: int, n: int, W: int = W, H: int = H) -> np.ndarray:
    """A red circle moving right and a blue square moving down over a grey gradient."""
    px = np.zeros((H, W, 3), dtype=np.uint8)
    px[..., 0] = np.linspace(40, 120, W, dtype=np.uint8)[None, :]
    px[..., 1] = np.linspace(60, 100, H, dtype=np.uint8)[:, None]
    px[..., 2] = 80
    img = Image.fromarray(px)
    d = ImageDraw.Draw(img)
    t = i / max(1, n - 1)
    cx = int(6 + t * (W - 20))
    d.ellipse([cx, 8, cx + 12, 20], fill=(230, 30, 30))
    sy = int(4 + t * (H - 18))
    d.rectangle([44, sy, 56, sy + 12], fill=(30, 60, 230))
    d.text((2, 34), str(i % 10), fill=(255, 255, 0))
    return np.asarray(img)


def encode(path: Path, fmt: str, codec: str, rate, n: int, pts=None, options=None, W=W, H=H):
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=rate)
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        s.options = options or {}
        if pts is not None:
            s.time_base = Fraction(1, 1000)
        for i in range(n):
            f = av.VideoFrame.from_ndarray(frame_rgb(i, n, W, H), format="rgb24")
            if pts is not None:
                f.pts = pts[i]
                f.time_base = Fraction(1, 1000)
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def sample_indices(total: int, fps: float) -> list[int]:
    """Qwen3VLVideoProcessor.sample_frames at its defaults (fps 2, 4..768 frames)."""
    fps = fps if fps else 24
    n = int(total / fps * 2)
    n = min(min(max(n, 4), 768), total)
    return np.linspace(0, total - 1, n).round().astype(int).tolist()


def pyav_frames(path: Path, indices: list[int]) -> np.ndarray:
    with av.open(str(path)) as c:
        out = []
        for i, f in enumerate(c.decode(video=0)):
            if i > indices[-1]:
                break
            out.extend([f.to_ndarray(format="rgb24")] * indices.count(i))
    return np.stack(out)


GOP_CLIP = "mp4_h264_gop8.mp4"


def clip_entry(path: Path, vp) -> dict:
    """A clip's reference entry (its count, rate and transformers' sampled indices) and its PyAV
    frames at those indices (<stem>.npy)."""
    from transformers.video_utils import read_video_pyav
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        stated, rate = int(s.frames), float(s.average_rate) if s.average_rate else 0.0
        dur = float(s.duration * s.time_base) if s.duration else (c.duration / 1e6 if c.duration else 0)
    entry = {"stated_frames": stated, "fps": rate}
    if stated > 0:
        _, meta = read_video_pyav(str(path), sample_indices_fn=vp.sample_frames)
        idx = vp.sample_frames(meta).tolist()
        entry.update(count_from="header", total_frames=int(meta.total_num_frames),
                     fps=float(meta.fps), indices=[int(i) for i in idx])
    else:
        with av.open(str(path)) as c:
            total = sum(1 for p in c.demux(video=0) if p.size > 0)
        entry.update(count_from="packets", duration=dur, total_frames=total,
                     indices=sample_indices(total, rate))
    np.save(OUT / (path.stem + ".npy"), pyav_frames(path, entry["indices"]))
    return entry


def timestamps_of(names: list[str], ref: dict) -> None:
    """Qwen3VLProcessor's prompt for each clip: the "<t seconds>" text before each temporal group
    (the mean of its two source timestamps, index / source fps), read back from the ids it gives
    for "<|vision_start|><|video_pad|><|vision_end|>" with the clip's frames."""
    import re
    import torch
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_qwen2_vl_fast import Qwen2VLImageProcessorFast
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata
    tok = AutoTokenizer.from_pretrained(str(OUT.parent.parent.parent / "data" / "tokenizer"))
    processor = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessorFast(), tokenizer=tok,
                                 video_processor=Qwen3VLVideoProcessor(
                                     size={"shortest_edge": 4096, "longest_edge": 25165824}))
    for name in names:
        entry = ref["clips"][name]
        frames = np.load(OUT / (Path(name).stem + ".npy"))
        if len(frames) < 2:
            continue  # transformers raises for one frame (vlm prices it as two; see preprocess.h)
        meta = VideoMetadata(total_num_frames=entry["total_frames"], fps=entry["fps"],
                             frames_indices=list(entry["indices"]))  # it pads in place
        enc = processor(text=["<|vision_start|><|video_pad|><|vision_end|>What moves?"],
                        videos=[torch.from_numpy(frames).permute(0, 3, 1, 2)],
                        video_metadata=[meta], do_sample_frames=False)
        text = tok.decode(enc["input_ids"][0])
        entry["timestamps"] = re.findall(r"<[0-9]+\.[0-9] seconds>", text)
        entry["groups"] = int(enc["video_grid_thw"][0][0])
        assert len(entry["timestamps"]) == entry["groups"], (name, text[:200])


def make_gop_clip(vp) -> dict:
    """5 s of H.264 at 30 fps with a keyframe every 8 frames and B-frames: the decoder seeks
    between its sampled frames (10 of 150, 16 apart)."""
    path = OUT / GOP_CLIP
    encode(path, "mp4", "libx264", 30, 150,
           options={"preset": "veryfast", "crf": "23", "bf": "2", "g": "8", "keyint_min": "8",
                    "sc_threshold": "0"})
    return clip_entry(path, vp)


def main() -> None:
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    if "--only-gop" in sys.argv:  # adds the seeking clip to an existing reference.json
        ref = json.loads((OUT / "reference.json").read_text())
        ref["clips"][GOP_CLIP] = make_gop_clip(Qwen3VLVideoProcessor())
        timestamps_of([GOP_CLIP], ref)
        (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
        print(GOP_CLIP, ref["clips"][GOP_CLIP])
        return

    OUT.mkdir(parents=True, exist_ok=True)
    vp = Qwen3VLVideoProcessor()
    encode(OUT / "mp4_h264_2997.mp4", "mp4", "libx264", Fraction(30000, 1001), 45,
           options={"preset": "veryfast", "crf": "23", "bf": "2"})
    encode(OUT / "mov_h264_single.mov", "mov", "libx264", 25, 1, options={"preset": "veryfast"})
    # A width that is not a multiple of 8 or 16 (swscale's vector paths overhang a row's end).
    encode(OUT / "mp4_h264_70x46.mp4", "mp4", "libx264", 12, 10, options={"preset": "veryfast"},
           W=70, H=46)
    encode(OUT / "webm_vp9_7.webm", "webm", "libvpx-vp9", 7, 20, options={"crf": "30", "b": "0"})
    vfr = [0, 40, 80, 200, 240, 400, 410, 420, 600, 700, 710, 900, 1000, 1100, 1300, 1500]
    encode(OUT / "mkv_vp8_vfr.mkv", "matroska", "libvpx", 10, len(vfr), pts=vfr)
    frames = [Image.fromarray(frame_rgb(i, 12)) for i in range(12)]
    frames[0].save(OUT / "gif_10.gif", save_all=True, append_images=frames[1:], duration=100,
                   loop=0)
    webp = [Image.fromarray(frame_rgb(i, 10)) for i in range(10)]
    webp[0].save(OUT / "webp_anim.webp", save_all=True, append_images=webp[1:], duration=100,
                 lossless=True, loop=0)

    ref = {"generator": "scripts/make_video_fixtures.py", "transformers": __import__("transformers").__version__,
           "av": av.__version__, "sampling": {"fps": 2, "min_frames": 4, "max_frames": 768},
           "clips": {}}
    for name in ["mp4_h264_2997.mp4", "mov_h264_single.mov", "mp4_h264_70x46.mp4",
                 "webm_vp9_7.webm", "mkv_vp8_vfr.mkv", "gif_10.gif"]:
        ref["clips"][name] = clip_entry(OUT / name, vp)
        print(name, ref["clips"][name])
    ref["clips"][GOP_CLIP] = make_gop_clip(vp)
    # WebP: Pillow's frames (no PyAV reader); the rate is frames / duration.
    with Image.open(OUT / "webp_anim.webp") as im:
        n = im.n_frames
        durs = []
        rgb = []
        for k in range(n):
            im.seek(k)
            im.load()
            durs.append(im.info.get("duration", 0))
            rgb.append(np.asarray(im.convert("RGB")))
    rate = n / (sum(durs) / 1000)
    idx = sample_indices(n, rate)
    np.save(OUT / "webp_anim.npy", np.stack([rgb[i] for i in idx]))
    ref["clips"]["webp_anim.webp"] = {"count_from": "webp", "total_frames": n, "fps": rate,
                                       "indices": idx}

    # sample_frames itself over a range of (frame count, rate): min/max clamps, rounding ties,
    # an unknown rate (24 assumed).
    from transformers.video_utils import VideoMetadata
    cases = []
    for total, fps in [(1, 30.0), (3, 30.0), (7, 7.0), (45, 30000 / 1001), (300, 30.0),
                       (301, 29.97), (1000, 23.976), (4321, 59.94), (100000, 30.0),
                       (600000, 25.0), (10, None), (250, None), (33, 0.5), (11, 4.0)]:
        meta = VideoMetadata(total_num_frames=total, fps=fps)
        cases.append({"total": total, "fps": fps if fps is not None else 0,
                      "indices": [int(i) for i in vp.sample_frames(meta)]})
    ref["sampling_cases"] = cases

    # Qwen3VLVideoProcessor over those frames (do_sample_frames=False): pixel_values_videos and
    # video_grid_thw at three pixel budgets -- the checkpoints' video_preprocessor_config.json
    # (4096..25165824: 64x48 goes to 64x64), one under the frames (downscaled to 32x32, an odd
    # frame count padded) and the class defaults (131072..786432: upscaled). The small ones are
    # stored whole (<case>.npy, float32), the large one as the SHA-256 of its float32 bytes.
    import hashlib
    import torch
    pre = []
    for clip, lo, hi, whole in [("mp4_h264_2997.mp4", 4096, 25165824, True),
                                ("webm_vp9_7.webm", 4096, 12288, True),
                                ("gif_10.gif", 131072, 786432, False)]:
        frames = np.load(OUT / (Path(clip).stem + ".npy"))
        proc = Qwen3VLVideoProcessor(size={"shortest_edge": lo, "longest_edge": hi})
        outp = proc(videos=[torch.from_numpy(frames).permute(0, 3, 1, 2)], do_sample_frames=False,
                    return_tensors="pt")
        pv = outp["pixel_values_videos"].numpy().astype(np.float32)
        case = {"clip": clip, "min_pixels": lo, "max_pixels": hi,
                "grid_thw": outp["video_grid_thw"][0].tolist(), "shape": list(pv.shape),
                "sha256": hashlib.sha256(np.ascontiguousarray(pv).tobytes()).hexdigest()}
        if whole:
            case["npy"] = "pre_" + Path(clip).stem + ".npy"
            np.save(OUT / case["npy"], pv)
        pre.append(case)
        print("preprocess", case)
    ref["preprocess_cases"] = pre

    timestamps_of(list(ref["clips"]), ref)

    data = (OUT / "mp4_h264_2997.mp4").read_bytes()
    (OUT / "truncated_mp4.mp4").write_bytes(data[: len(data) * 2 // 5])
    (OUT / "garbage.mp4").write_bytes(bytes((i * 73 + 11) % 256 for i in range(4096)))
    (OUT / "wrong_extension.mp4").write_bytes((OUT / "webm_vp9_7.webm").read_bytes())
    with av.open(str(OUT / "zero_frames.mp4"), "w", format="mp4") as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        c.start_encoding()  # the header, with no packet after it
    # Headers that state enormous frames: an animated WebP canvas of 60000x60000 (VP8X holds
    # 24-bit sides) and a GIF screen of 65535x65535 (its 16-bit maximum).
    w = bytearray((OUT / "webp_anim.webp").read_bytes())
    assert w[12:16] == b"VP8X"
    w[24:27] = (60000 - 1).to_bytes(3, "little")  # under libwebp's own 2^32 area bound
    w[27:30] = (60000 - 1).to_bytes(3, "little")
    (OUT / "huge_header.webp").write_bytes(bytes(w))
    g = bytearray((OUT / "gif_10.gif").read_bytes())
    g[6:10] = (65535).to_bytes(2, "little") * 2
    (OUT / "huge_header.gif").write_bytes(bytes(g))
    # A Matroska file whose Duration element states 10 hours (36e6 ms in a float64).
    mkv = bytearray((OUT / "mkv_vp8_vfr.mkv").read_bytes())
    d = mkv.find(b"\x44\x89")
    assert d > 0
    size = mkv[d + 2] & 0x7F
    if size == 8:
        import struct
        mkv[d + 3: d + 11] = struct.pack(">d", 36e6)
    else:
        import struct
        mkv[d + 3: d + 7] = struct.pack(">f", 36e6)
    (OUT / "long_header.mkv").write_bytes(bytes(mkv))
    # Lists that would make FFmpeg open other files or URLs: an HLS playlist and a concat list.
    (OUT / "playlist.m3u8").write_bytes(b"#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:2,\n"
                                        b"file:///etc/passwd\n#EXTINF:2,\n"
                                        b"http://127.0.0.1:9/clip.ts\n#EXT-X-ENDLIST\n")
    (OUT / "concat.txt").write_bytes(b"ffconcat version 1.0\nfile mp4_h264_2997.mp4\n")
    # Each hostile file and a word its error must contain.
    ref["hostile"] = {"truncated_mp4.mp4": "truncated", "garbage.mp4": "not a video format",
                      "zero_frames.mp4": "video stream", "huge_header.webp": "pixels",
                      "huge_header.gif": "pixels", "long_header.mkv": "duration",
                      "playlist.m3u8": "not a video format", "concat.txt": "not a video format"}
    ref["wrong_extension"] = "wrong_extension.mp4"
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


if __name__ == "__main__":
    main()
