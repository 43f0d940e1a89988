#!/usr/bin/env python3
"""Serving load generator for `vlm serve` (or any OpenAI-compatible chat server).

Runs a closed-loop concurrency sweep with an image+text chat workload and reports, per
concurrency level, requests/s, output tok/s and TTFT / TPOT / ITL / end-to-end latency
percentiles as a markdown table (stdout), a JSON file and a PNG plot.

Workloads (--workload, or a recorded one):
  single     every request a fresh conversation: --images-per-request distinct images (one by
             default) and a question.
  multiturn  conversations of --turns requests: an image and a question, then follow-up
             questions, each request carrying the whole chat so far (the replies included), as
             chat clients send it; concurrency counts conversations in flight. TTFT is also
             reported for the first turns and the follow-ups apart, with the prompt tokens the
             server says it found cached (usage.prompt_tokens_details.cached_tokens).

  --request-file FILE.jsonl: recorded chat-completions bodies, one a line, sent in turn.

With --vlm, --variant NAME=ARGS (repeatable) runs the whole sweep once per variant, each on its
own server started with --serve-args plus ARGS, in one run (e.g. --variant on= --variant
off=--no-prefix-caching), and reports them side by side.

Each request streams (`stream: true`, `stream_options.include_usage`), decodes greedily
(`temperature: 0`) and asks for exactly `--output-len` tokens (`max_tokens` plus the vLLM-style
`ignore_eos: true`; a recorded body keeps its own). With --ramp, each level's first
`concurrency` requests start spread over the warm-up request's time instead of all at once.
Every generated image is a distinct JPEG made deterministically from the photos in
tests/data/images (random crop, resize, flip, brightness), so a server that caches
vision-encoder outputs by image content never gets a repeat.

Metric definitions follow vLLM's benchmarks/benchmark_serving.py:
  TTFT  first non-empty content chunk - request start
  TPOT  (e2e - TTFT) / (completion_tokens - 1), requests with more than one token
  ITL   gaps between successive non-empty content chunks (all requests pooled)
  E2E   last byte of the stream - request start
  req/s = completed requests / level wall time; output tok/s = sum of completion_tokens / level
  wall time (the level's wall time runs from its first request's start to its last one's end).

Dependencies: scripts/requirements-bench.txt (httpx, numpy, matplotlib, pillow).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as _dt
import hashlib
import io
import json
import math
import random
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

SCRIPT_DIR = Path(__file__).resolve().parent
# The photos: the checkout's, or those installed beside the scripts (PREFIX/share/vlm/images).
DEFAULT_IMAGES = next((d for d in (SCRIPT_DIR.parent / "tests" / "data" / "images",
                                   SCRIPT_DIR.parent / "images") if d.is_dir()),
                      SCRIPT_DIR.parent / "tests" / "data" / "images")
IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif"}
PERCENTILES = (50, 90, 99)
# Gauges whose largest value during a level is reported (sampled every 0.5 s).
PEAK_GAUGES = ("vlm_num_requests_running", "vlm_kv_cache_blocks_used")

FILLER = (
    "the quick brown fox jumps over a lazy dog while seven bright stars drift across an old "
    "harbour near quiet hills where painters gather morning light on wooden boats and green "
    "fields beside the river carry soft winds through tall grass under a pale blue sky"
).split()


# --------------------------------------------------------------------------- workload


def load_photos(images_dir: Path):
    from PIL import Image

    files = sorted(p for p in images_dir.iterdir() if p.suffix.lower() in IMAGE_EXTS)
    if not files:
        raise SystemExit(f"bench_serve: no images in {images_dir}")
    photos = []
    for p in files:
        with Image.open(p) as im:
            photos.append((p.name, im.convert("RGB")))
    return photos


class ImageMaker:
    """Deterministic, distinct JPEGs: image i depends only on (seed, i, size, the photos)."""

    def __init__(self, photos, size: tuple[int, int], seed: int, quality: int):
        self.photos = photos
        self.size = size
        self.seed = seed
        self.quality = quality
        self.seen: set[str] = set()

    def _render(self, rng: random.Random) -> bytes:
        from PIL import Image, ImageEnhance

        _, src = self.photos[rng.randrange(len(self.photos))]
        w, h = src.size
        tw, th = self.size
        # Random crop: 30-100% of the area, aspect near the target's.
        area = w * h * rng.uniform(0.3, 1.0)
        aspect = (tw / th) * math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw = max(8, min(w, int(round(math.sqrt(area * aspect)))))
        ch = max(8, min(h, int(round(math.sqrt(area / aspect)))))
        x = rng.randint(0, w - cw)
        y = rng.randint(0, h - ch)
        im = src.crop((x, y, x + cw, y + ch)).resize((tw, th), Image.BICUBIC)
        if rng.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        im = ImageEnhance.Brightness(im).enhance(rng.uniform(0.85, 1.15))
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=self.quality)
        return buf.getvalue()

    def make(self, index: int) -> bytes:
        for attempt in range(100):
            rng = random.Random(f"{self.seed}:{index}:{attempt}")
            data = self._render(rng)
            digest = hashlib.sha256(data).hexdigest()
            if digest not in self.seen:
                self.seen.add(digest)
                return data
        raise RuntimeError("could not make a distinct image")


def make_prompt(words: int, index: int) -> str:
    question = "Describe this image in one sentence."
    if words <= 0:
        return question
    rng = random.Random(index)
    start = rng.randrange(len(FILLER))
    filler = " ".join(FILLER[(start + k) % len(FILLER)] for k in range(words))
    return f"{question} Context: {filler}."


FOLLOW_UPS = [
    "What colours stand out the most?",
    "Is there any text or writing visible?",
    "What might have happened just before this picture was taken?",
    "Summarise the picture in five words.",
    "Which object is closest to the camera?",
    "Describe the lighting.",
]


def first_message(args, index: int, images: ImageMaker | None) -> tuple[dict, int]:
    """Request `index`'s user message (its --images-per-request images, then the question) and
    the images' bytes."""
    text = make_prompt(args.prompt_words, index)
    image_bytes = 0
    if images is None:
        content: Any = text
    else:
        per = getattr(args, "images_per_request", 1)
        content = []
        for k in range(per):
            jpeg = images.make(index if per == 1 else index * per + k)
            image_bytes += len(jpeg)
            url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
            content.append({"type": "image_url", "image_url": {"url": url}})
        content.append({"type": "text", "text": text})
    return {"role": "user", "content": content}, image_bytes


def load_request_file(path: str) -> list[dict]:
    """A recorded workload: one chat-completions request body (a JSON object with `messages`)
    per line; blank lines are skipped."""
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"bench_serve: --request-file {path}: {e}")
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise SystemExit(f"bench_serve: --request-file {path}:{no}: not JSON ({e})")
        if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
            raise SystemExit(f"bench_serve: --request-file {path}:{no}: not a chat request "
                             f"(an object with a messages list)")
        out.append(obj)
    if not out:
        raise SystemExit(f"bench_serve: --request-file {path}: no requests")
    return out


def recorded_body(args, model: str, index: int) -> bytes:
    """Request `index` of the recorded workload (cycling through the file), streamed with usage
    and sent to `model`; a request without max_tokens (or max_completion_tokens) gets
    --output-len with ignore_eos."""
    body = dict(args.recorded[index % len(args.recorded)])
    body["model"] = model
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = args.output_len
        body["ignore_eos"] = True
    return json.dumps(body).encode("utf-8")


def build_body(args, model: str, index: int, images: ImageMaker | None) -> tuple[bytes, int]:
    if getattr(args, "recorded", None):
        return recorded_body(args, model, index), 0
    message, image_bytes = first_message(args, index, images)
    return chat_body(args, model, [message]), image_bytes


def chat_body(args, model: str, messages: list[dict]) -> bytes:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": args.output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if getattr(args, "logprobs", 0):
        body["logprobs"] = True
        body["top_logprobs"] = args.logprobs
    return json.dumps(body).encode("utf-8")


# --------------------------------------------------------------------------- requests


@dataclass
class RequestResult:
    index: int
    ok: bool = False
    error: str = ""
    start: float = 0.0  # perf_counter seconds
    first_chunk: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # every non-empty content chunk
    end: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    image_bytes: int = 0
    output_chars: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    turn: int = 0  # multiturn: 0 for a conversation's first request
    text: str = ""  # the reply (multiturn: the next request carries it)

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float | None:
        return None if self.first_chunk is None else self.first_chunk - self.start

    @property
    def output_tokens(self) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.chunk_times)  # no usage chunk: fall back to chunks seen

    @property
    def tpot(self) -> float | None:
        n = self.output_tokens
        if self.ttft is None or n <= 1:
            return None
        return (self.e2e - self.ttft) / (n - 1)

    @property
    def itls(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]


def _error_text(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err if err is not None else obj)


async def _stream_request(client: httpx.AsyncClient, url: str, headers: dict, body: bytes,
                          res: RequestResult) -> None:
    async with client.stream("POST", url, content=body, headers=headers) as resp:
        if resp.status_code != 200:
            raw = (await resp.aread()).decode("utf-8", "replace")
            try:
                msg = _error_text(json.loads(raw))
            except ValueError:
                msg = raw.strip()[:300]
            res.error = f"HTTP {resp.status_code}: {msg}"
            return
        done = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                break
            try:
                obj = json.loads(payload)
            except ValueError:
                res.error = f"bad SSE payload: {payload[:200]}"
                return
            if "error" in obj:
                res.error = "stream error: " + _error_text(obj)
                return
            now = time.perf_counter()
            for choice in obj.get("choices") or []:
                delta = choice.get("delta") or {}
                text = delta.get("content")
                if text:
                    if res.first_chunk is None:
                        res.first_chunk = now
                    res.chunk_times.append(now)
                    res.output_chars += len(text)
                    res.text += text
                if choice.get("finish_reason"):
                    res.finish_reason = choice["finish_reason"]
            usage = obj.get("usage")
            if usage:
                res.prompt_tokens = usage.get("prompt_tokens")
                res.completion_tokens = usage.get("completion_tokens")
                details = usage.get("prompt_tokens_details") or {}
                if details.get("cached_tokens") is not None:
                    res.cached_tokens = details["cached_tokens"]
        if not done:
            res.error = "stream ended without [DONE]"
            return
        if res.first_chunk is None:
            res.error = "no content in the reply"
            return
        res.ok = True


async def send_request(client: httpx.AsyncClient, url: str, headers: dict, body: bytes,
                       index: int, image_bytes: int, timeout: float) -> RequestResult:
    res = RequestResult(index=index, image_bytes=image_bytes)
    res.start = time.perf_counter()
    try:
        await asyncio.wait_for(_stream_request(client, url, headers, body, res), timeout)
    except asyncio.TimeoutError:
        res.error = f"timeout after {timeout:g} s"
    except httpx.HTTPError as e:
        res.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    except Exception as e:  # noqa: BLE001 - a request never takes the sweep down
        res.error = f"{type(e).__name__}: {e}"
    res.end = time.perf_counter()
    if res.error:
        res.ok = False
    return res


# --------------------------------------------------------------------------- /metrics

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


async def scrape_metrics(client: httpx.AsyncClient, base: str) -> dict[str, Any] | None:
    """{"samples": {name{labels}: value}, "types": {family: counter|gauge|histogram|...}}."""
    try:
        r = await client.get(base + "/metrics", timeout=10.0)
        if r.status_code != 200:
            return None
    except httpx.HTTPError:
        return None
    out: dict[str, float] = {}
    types: dict[str, str] = {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                types[parts[2]] = parts[3]
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        except ValueError:
            pass
    return {"samples": out, "types": types}


def _family(name: str, types: dict[str, str]) -> tuple[str, str | None]:
    """The metric family a sample belongs to and its declared type."""
    if name in types:
        return name, types[name]
    for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            return name[: -len(suffix)], types[name[: -len(suffix)]]
    return name, None


def metrics_delta(before: dict | None, after: dict | None) -> dict[str, Any]:
    """Deltas of counters and of histogram/summary _sum/_count (buckets left out), and gauges
    after the level. Types come from the # TYPE lines; untyped samples count as counters when
    their name ends in _total."""
    if not before or not after:
        return {}
    types = after["types"]
    prev = before["samples"]
    deltas, gauges = {}, {}
    for k, v in after["samples"].items():
        name = k.split("{", 1)[0]
        _, kind = _family(name, types)
        if name.endswith("_bucket"):
            continue
        cumulative = (kind == "counter" or (kind in ("histogram", "summary")
                                            and name.endswith(("_sum", "_count")))
                      or (kind is None and name.endswith("_total")))
        if cumulative:
            deltas[k] = v - prev.get(k, 0.0)
        else:
            gauges[k] = v
    return {"deltas": deltas, "gauges_after": gauges}


def _sum_matching(d: dict[str, float], pred) -> float | None:
    vals = [v for k, v in d.items() if pred(k.split("{", 1)[0])]
    return sum(vals) if vals else None


def highlight_metrics(delta: dict[str, Any]) -> dict[str, float | None]:
    d = delta.get("deltas", {})
    out = {
        "vision_cache_hits": _sum_matching(d, lambda n: n == "vlm_vision_cache_hits_total"),
        "vision_cache_misses": _sum_matching(d, lambda n: n == "vlm_vision_cache_misses_total"),
        "preemptions": _sum_matching(d, lambda n: "preempt" in n and n.endswith("_total")),
    }
    # Server-side means over the level of every histogram (TTFT, ITL, E2E, queue time, image
    # preprocess / encode where the server has them), from the _sum/_count deltas.
    means = {}
    for k, v in d.items():
        if "{" not in k and k.endswith("_sum"):
            c = d.get(k[:-4] + "_count")
            if c:
                means[k[:-4]] = v / c
    out["histogram_means"] = means
    return out


# --------------------------------------------------------------------------- statistics


def stats(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "mean": None, **{f"p{p}": None for p in PERCENTILES}}
    a = np.asarray(values, dtype=np.float64) * scale
    out: dict[str, float | None] = {"n": int(a.size), "mean": float(a.mean())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(a, p))
    return out


def summarize(conc: int, results: list[RequestResult], output_len: int | None) -> dict[str, Any]:
    """A level's figures; `output_len`: the length every reply should have (None: any)."""
    ok = [r for r in results if r.ok]
    t0 = min(r.start for r in results)
    t1 = max(r.end for r in results)
    duration = t1 - t0
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    short = [r for r in ok if output_len is not None and r.completion_tokens is not None
             and r.completion_tokens != output_len]
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    return {
        "concurrency": conc,
        "num_requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": out_tokens / duration if duration > 0 else 0.0,
        "input_throughput": in_tokens / duration if duration > 0 else 0.0,
        "total_output_tokens": out_tokens,
        "total_prompt_tokens": in_tokens,
        "mean_prompt_tokens": in_tokens / len(ok) if ok else None,
        "requests_not_output_len": len(short),
        "missing_usage": sum(1 for r in ok if r.completion_tokens is None),
        "ttft_ms": stats([r.ttft for r in ok if r.ttft is not None]),
        "ttft_first_turn_ms": stats([r.ttft for r in ok if r.ttft is not None and r.turn == 0]),
        "ttft_follow_up_ms": stats([r.ttft for r in ok if r.ttft is not None and r.turn > 0]),
        "cached_prompt_tokens": sum(cached) if cached else None,
        "tpot_ms": stats([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": stats([g for r in ok for g in r.itls]),
        "e2e_ms": stats([r.e2e for r in ok]),
        "failures": [f"#{r.index}: {r.error}" for r in results if not r.ok],
        "requests": [
            {
                "index": r.index,
                "ok": r.ok,
                "error": r.error or None,
                "start_s": r.start - t0,
                "ttft_s": r.ttft,
                "e2e_s": r.e2e,
                "chunk_times_s": [t - r.start for t in r.chunk_times],
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
                "finish_reason": r.finish_reason,
                "image_bytes": r.image_bytes,
                "output_chars": r.output_chars,
                "cached_tokens": r.cached_tokens,
                "turn": r.turn,
            }
            for r in results
        ],
    }


# --------------------------------------------------------------------------- output


def _fmt(v: float | None) -> str:
    if v is None:
        return "–"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _trio(s: dict) -> str:
    return " / ".join(_fmt(s.get(f"p{p}")) for p in PERCENTILES)


def _count(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def markdown_table(levels: list[dict]) -> str:
    show_cache = any(l["server"].get("vision_cache_hits") is not None
                     or l["server"].get("vision_cache_misses") is not None for l in levels)
    show_preempt = any(l["server"].get("preemptions") is not None for l in levels)
    show_step = any("vlm_engine_step_seconds" in l["server"].get("histogram_means", {}) for l in levels)
    show_turns = any(l["ttft_follow_up_ms"]["n"] for l in levels)
    show_cached = any(l.get("cached_prompt_tokens") is not None for l in levels)
    show_peak = any(l["server"].get("peaks") for l in levels)
    head = ["conc", "reqs", "fail", "req/s", "out tok/s",
            "TTFT ms p50/p90/p99", "TPOT ms p50/p90/p99", "ITL ms p50/p90/p99",
            "E2E ms p50/p90/p99"]
    if show_turns:
        head += ["TTFT 1st turn ms p50/p90/p99", "TTFT follow-ups ms p50/p90/p99"]
    if show_cached:
        head.append("prompt tokens cached")
    if show_peak:
        head.append("peak running / KV blocks used")
    if show_cache:
        head.append("vision cache hit/miss")
    if show_preempt:
        head.append("preempted")
    if show_step:
        head.append("engine step ms (mean)")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for l in levels:
        row = [str(l["concurrency"]), str(l["num_requests"]), str(l["failed"]),
               f"{l['request_throughput']:.3f}", f"{l['output_throughput']:.2f}",
               _trio(l["ttft_ms"]), _trio(l["tpot_ms"]), _trio(l["itl_ms"]), _trio(l["e2e_ms"])]
        if show_turns:
            row += [_trio(l["ttft_first_turn_ms"]), _trio(l["ttft_follow_up_ms"])]
        if show_cached:
            c, t = l.get("cached_prompt_tokens"), l["total_prompt_tokens"]
            row.append("–" if c is None or not t else f"{100.0 * c / t:.0f}%")
        if show_peak:
            p = l["server"].get("peaks") or {}
            row.append(f"{_count(p.get('vlm_num_requests_running'))} / "
                       f"{_count(p.get('vlm_kv_cache_blocks_used'))}")
        if show_cache:
            row.append(f"{_count(l['server'].get('vision_cache_hits'))} / "
                       f"{_count(l['server'].get('vision_cache_misses'))}")
        if show_preempt:
            row.append(_count(l["server"].get("preemptions")))
        if show_step:
            step = l["server"].get("histogram_means", {}).get("vlm_engine_step_seconds")
            row.append("—" if step is None else f"{step * 1000:.2f}")
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def plot(levels: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conc = [l["concurrency"] for l in levels]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    fig.suptitle(title, fontsize=10)

    ax = axes[0][0]
    ax.plot(conc, [l["request_throughput"] for l in levels], "o-", color="tab:blue",
            label="requests/s")
    ax.set_ylabel("requests/s", color="tab:blue")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(conc, [l["output_throughput"] for l in levels], "s--", color="tab:orange",
             label="output tok/s")
    ax2.set_ylabel("output tok/s", color="tab:orange")
    ax2.set_ylim(bottom=0)
    ax.set_title("throughput")
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left", fontsize=8)

    panels = [(axes[0][1], "ttft_ms", "TTFT"), (axes[1][0], "tpot_ms", "TPOT"),
              (axes[1][1], "e2e_ms", "end-to-end latency")]
    for ax, key, name in panels:
        for p, style in ((50, "o-"), (99, "s--")):
            xs = [c for c, l in zip(conc, levels) if l[key].get(f"p{p}") is not None]
            ys = [l[key][f"p{p}"] for l in levels if l[key].get(f"p{p}") is not None]
            ax.plot(xs, ys, style, label=f"p{p}")
        vals = [l[key].get(f"p{p}") for l in levels for p in (50, 99)]
        vals = [v for v in vals if v is not None and v > 0]
        if not vals:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center")
        elif max(vals) / min(vals) > 20:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_title(f"{name} (ms)")
        ax.set_ylabel("ms")
        if vals:
            ax.legend(fontsize=8)

    for ax in (axes[0][0], axes[0][1], axes[1][0], axes[1][1]):
        ax.set_xscale("log", base=2)
        ax.set_xlim(min(conc) / 1.25, max(conc) * 1.25)
        ax.set_xticks(conc)
        ax.set_xticklabels([str(c) for c in conc])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_variants(runs: list[dict], path: str, title: str) -> None:
    """Each variant's sweep on the same axes: throughput, TTFT (all, and follow-up turns when
    there are any) and end-to-end latency, p50 solid and p99 dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    fig.suptitle(title, fontsize=10)
    follow = any(l["ttft_follow_up_ms"]["n"] for r in runs for l in r["levels"])
    panels = [(axes[0][1], "ttft_ms", "TTFT, all requests (ms)"),
              (axes[1][0], "ttft_follow_up_ms" if follow else "tpot_ms",
               "TTFT, follow-up turns (ms)" if follow else "TPOT (ms)"),
              (axes[1][1], "e2e_ms", "end-to-end latency (ms)")]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    conc_all = sorted({l["concurrency"] for r in runs for l in r["levels"]})
    for i, r in enumerate(runs):
        c = colors[i % len(colors)]
        conc = [l["concurrency"] for l in r["levels"]]
        axes[0][0].plot(conc, [l["request_throughput"] for l in r["levels"]], "o-", color=c,
                        label=r["name"])
        for ax, key, _ in panels:
            for p, style in ((50, "o-"), (99, "s--")):
                pts = [(l["concurrency"], l[key].get(f"p{p}")) for l in r["levels"]
                       if l[key].get(f"p{p}") is not None]
                if pts:
                    ax.plot(*zip(*pts), style, color=c, label=f"{r['name']} p{p}")
    axes[0][0].set_title("throughput (requests/s)")
    axes[0][0].set_ylim(bottom=0)
    for ax, _, name in panels:
        ax.set_title(name)
        ax.set_yscale("log")
    for ax in (axes[0][0], axes[0][1], axes[1][0], axes[1][1]):
        ax.set_xscale("log", base=2)
        ax.set_xticks(conc_all)
        ax.set_xticklabels([str(c) for c in conc_all])
        ax.set_xlabel("concurrency")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- server process


class ServerProcess:
    """Starts `vlm serve -m DIR --port 0 ...`, learns the port from its log line."""

    def __init__(self, vlm: str, model: str, serve_args: str, log_path: str):
        extra = shlex.split(serve_args)
        cmd = [vlm, "serve", "-m", model]
        if "--port" not in extra:
            cmd += ["--port", "0"]
        cmd += extra
        self.cmd = cmd
        self.log_path = log_path
        self.url: str | None = None
        self._found = threading.Event()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")
        self.log = open(log_path, "w", encoding="utf-8")
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            m = re.search(r"serving on (http://\S+?)(?:\s|$)", line)
            if m and self.url is None:
                self.url = m.group(1).rstrip("/")
                self._found.set()
        self._found.set()

    def wait_url(self, timeout: float) -> str:
        self._found.wait(timeout)
        if self.url is None:
            raise SystemExit(f"bench_serve: the server did not report its address "
                             f"(exit code {self.proc.poll()}); log: {self.log_path}\n"
                             + self.tail())
        return self.url

    def tail(self, n: int = 20) -> str:
        try:
            return "".join(Path(self.log_path).read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._thread.join(2)
        self.log.close()


async def wait_health(client: httpx.AsyncClient, base: str, timeout: float,
                      server: ServerProcess | None) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if server is not None and server.proc.poll() is not None:
            raise SystemExit(f"bench_serve: the server exited with code {server.proc.returncode}"
                             f"\n{server.tail()}")
        try:
            r = await client.get(base + "/health", timeout=5.0)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = f"{type(e).__name__}: {e}"
        await asyncio.sleep(0.5)
    raise SystemExit(f"bench_serve: {base}/health not ready after {timeout:g} s ({last})")


# --------------------------------------------------------------------------- main


def add_server_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The options that start a vlm server (or name a running one), shared with tune_serve.py."""
    g = p.add_argument_group("server")
    g.add_argument("--vlm", help="the vlm binary to start (needs --model)")
    g.add_argument("-m", "--model", help="checkpoint directory (or what `vlm serve -m` takes) "
                   "for --vlm")
    g.add_argument("--serve-args", default="",
                   help='extra `vlm serve` flags, e.g. --serve-args="-t 2 --quant int8"')
    g.add_argument("--startup-timeout", type=float, default=600.0,
                   help="seconds to wait for /health")
    g.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    g.add_argument("--model-name", help="'model' in the requests; /v1/models' first id if unset")
    return g


def add_workload_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """What each request is, shared with tune_serve.py (checked by check_workload_args)."""
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=("single", "multiturn"), default="single",
                   help="single: images + question per request; multiturn: conversations "
                   "of --turns requests (see the module doc)")
    w.add_argument("--turns", type=int, default=5,
                   help="multiturn: requests per conversation (the image turn + follow-ups)")
    w.add_argument("--request-file", metavar="FILE.jsonl",
                   help="a recorded workload instead: one chat-completions body per line, "
                   "sent in turn (cycling: a repeat may hit the server's caches); 'model' and "
                   "streaming are set, and a body without max_tokens gets --output-len")
    w.add_argument("--output-len", type=int, default=32, help="max_tokens (with ignore_eos)")
    w.add_argument("--image-size", default="448x448", help="WxH of each generated JPEG")
    w.add_argument("--images-per-request", type=int, default=1,
                   help="generated images in each request's message")
    w.add_argument("--no-image", action="store_true", help="text-only requests")
    w.add_argument("--logprobs", type=int, default=0,
                   help="ask for logprobs with this many top alternatives per token (0: none)")
    w.add_argument("--images-dir", default=str(DEFAULT_IMAGES), help="source photos")
    w.add_argument("--jpeg-quality", type=int, default=90)
    w.add_argument("--prompt-words", type=int, default=0,
                   help="filler words appended to the question")
    w.add_argument("--warmup", type=int, default=1,
                   help="warm-up requests (sequential, not measured) before the measured ones")
    w.add_argument("--seed", type=int, default=0, help="seed for the generated images")
    w.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds before one request counts as failed")
    return w


def check_workload_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    m = re.fullmatch(r"(\d+)[xX](\d+)", args.image_size)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        p.error("--image-size takes WxH, e.g. 448x448")
    args.size = (int(m.group(1)), int(m.group(2)))
    if args.output_len < 1:
        p.error("--output-len must be >= 1")
    if args.vlm and not args.model:
        p.error("--vlm needs --model")
    if args.turns < 1:
        p.error("--turns must be >= 1")
    if args.images_per_request < 1:
        p.error("--images-per-request must be >= 1 (--no-image for none)")
    args.recorded = None
    if args.request_file:
        if args.workload != "single":
            p.error("--request-file sends its own requests: not with --workload multiturn")
        args.recorded = load_request_file(args.request_file)
        args.no_image = True  # the file's requests carry their own media


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Concurrency sweep against an OpenAI-compatible chat server (vlm serve).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = add_server_args(p)
    g.add_argument("--base-url", default="http://127.0.0.1:8080",
                   help="a running server (ignored with --vlm)")
    g.add_argument("--server-log", help="where the started server's output goes; "
                   "a temporary file if unset")
    g.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                   help="with --vlm: run the sweep once per variant, its server started with "
                   "--serve-args plus ARGS (repeatable)")
    w = add_workload_args(p)
    w.add_argument("--concurrency", default="1,2,4,8,16",
                   help="comma-separated levels (requests in flight)")
    w.add_argument("--ramp", action="store_true",
                   help="spread each level's first `concurrency` starts over the last warm-up "
                   "request's time (steady serving rather than a burst of arrivals; what "
                   "tune_serve.py measures)")
    w.add_argument("--requests-per-level", type=int, default=0,
                   help="requests (multiturn: conversations) per level (0: 2 x concurrency, "
                   "at least 4)")
    o = p.add_argument_group("output")
    o.add_argument("--out-json", default="bench_serve.json", help="'' to skip")
    o.add_argument("--out-png", default="bench_serve.png", help="'' to skip")
    o.add_argument("--quiet", action="store_true", help="no per-level progress on stderr")
    args = p.parse_args(argv)
    try:
        args.levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        p.error("--concurrency takes comma-separated integers")
    if not args.levels or min(args.levels) < 1:
        p.error("--concurrency levels must be >= 1")
    check_workload_args(p, args)
    if args.variant and not args.vlm:
        p.error("--variant needs --vlm (each variant starts its own server)")
    if args.ramp and (args.warmup < 1 or args.workload != "single"):
        p.error("--ramp times the warm-up request and spreads single requests: not with "
                "--warmup 0 or --workload multiturn")
    args.variants = []
    for v in args.variant:
        name, sep, extra = v.partition("=")
        if not sep or not name:
            p.error(f"--variant takes NAME=ARGS, got {v!r}")
        args.variants.append((name, extra))
    return args


def log(args, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(SCRIPT_DIR), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


async def run_level(args: argparse.Namespace, client: httpx.AsyncClient,
                    side: httpx.AsyncClient, base: str, model: str, images: ImageMaker | None,
                    conc: int, n: int, next_index: int, stagger_s: float = 0.0,
                    bodies: list[tuple[int, bytes, int]] | None = None) -> tuple[dict, int]:
    """One level: `n` requests (multiturn: conversations) with `conc` in flight, numbered from
    `next_index`; its summary (with the server's metrics over the level and the peaks of
    PEAK_GAUGES) and the next free index. `client` carries the measured requests, `side` the
    /metrics scrapes. Single requests only: with `stagger_s`, the first `conc` requests start
    that many seconds apart rather than all at once; `bodies` ((index, body, image bytes), at
    least `n`) are sent instead of new ones."""
    url = base + "/v1/chat/completions"
    sem = asyncio.Semaphore(conc)
    if args.workload == "single":
        if bodies is not None:
            bodies = bodies[:n]
        else:  # build every body (and image) before the clock starts
            bodies = []
            for _ in range(n):
                bodies.append((next_index, *build_body(args, model, next_index, images)))
                next_index += 1

        async def one(idx: int, body: bytes, nbytes: int) -> list[RequestResult]:
            async with sem:  # FIFO: the first `conc` requests hold the first slots
                k = idx - bodies[0][0]
                if k < conc and stagger_s > 0:
                    await asyncio.sleep(k * stagger_s)
                return [await send_request(client, url, {}, body, idx, nbytes, args.timeout)]

        jobs = [one(i, b, nb) for i, b, nb in bodies]
    else:
        firsts = []
        for _ in range(n):
            firsts.append((next_index, *first_message(args, next_index, images)))
            next_index += 1

        async def chat(idx: int, first: dict, nbytes: int) -> list[RequestResult]:
            async with sem:
                messages, out = [first], []
                for t in range(args.turns):
                    body = chat_body(args, model, messages)
                    res = await send_request(client, url, {}, body, idx * args.turns + t,
                                             nbytes if t == 0 else 0, args.timeout)
                    res.turn = t
                    out.append(res)
                    if not res.ok:
                        break
                    messages.append({"role": "assistant", "content": res.text})
                    messages.append({"role": "user",
                                     "content": FOLLOW_UPS[(idx + t) % len(FOLLOW_UPS)]})
                return out

        jobs = [chat(i, m, nb) for i, m, nb in firsts]
    before = await scrape_metrics(side, base)
    peaks: dict[str, float] = {}
    done = asyncio.Event()

    async def sample() -> None:
        # The gauges' peaks over the level, read every half second.
        while not done.is_set():
            m = await scrape_metrics(side, base)
            for k, v in ((m or {}).get("samples") or {}).items():
                if k in PEAK_GAUGES:
                    peaks[k] = max(peaks.get(k, v), v)
            try:
                await asyncio.wait_for(done.wait(), 0.5)
            except asyncio.TimeoutError:
                pass

    sampler = asyncio.create_task(sample())
    try:
        results = [r for rs in await asyncio.gather(*jobs) for r in rs]
    finally:
        done.set()
        await sampler
    after = await scrape_metrics(side, base)
    summary = summarize(conc, results, None if args.request_file else args.output_len)
    delta = metrics_delta(before, after)
    summary["server"] = highlight_metrics(delta)
    summary["server"]["peaks"] = peaks
    summary["server_metrics"] = delta
    return summary, next_index


def clients(conc: int, api_key: str | None,
            timeout: float) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    """A run's two clients: the measured chat requests get their own connection pool (room for
    `conc` in flight), and /health, /v1/models and /metrics go over another, so a GET never
    shares (and changes the TCP state of) a connection that a measured request then reuses."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    limits = httpx.Limits(max_connections=conc + 4, max_keepalive_connections=conc + 4,
                          keepalive_expiry=4.0)
    client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout, connect=30.0),
                               headers=headers)
    return client, httpx.AsyncClient(timeout=30.0, headers=headers)


async def served_models(side: httpx.AsyncClient, base: str) -> list[str]:
    """/v1/models' ids ([] when it does not answer with them)."""
    try:
        r = await side.get(base + "/v1/models", timeout=10.0)
        return [m.get("id") for m in r.json().get("data", [])]
    except (httpx.HTTPError, ValueError, AttributeError):
        return []


async def run(args: argparse.Namespace, server: ServerProcess | None) -> dict:
    base = args.base_url.rstrip("/")
    client, side = clients(max(args.levels), args.api_key, args.timeout)
    async with client, side:
        await wait_health(side, base, args.startup_timeout, server)
        served_ids = await served_models(side, base)
        model = args.model_name
        if model is None:
            model = served_ids[0] if served_ids else "default"
        log(args, f"bench_serve: {base}, model {model!r}")

        images = None
        if not args.no_image:
            images = ImageMaker(load_photos(Path(args.images_dir)), args.size, args.seed,
                                args.jpeg_quality)
        url = base + "/v1/chat/completions"
        next_index = 0

        warmups = []
        for _ in range(max(0, args.warmup)):
            body, nbytes = build_body(args, model, next_index, images)
            res = await send_request(client, url, {}, body, next_index, nbytes, args.timeout)
            next_index += 1
            warmups.append({"ok": res.ok, "error": res.error or None, "e2e_s": res.e2e,
                            "ttft_s": res.ttft, "completion_tokens": res.completion_tokens})
            log(args, f"  warm-up: {'ok' if res.ok else 'FAILED ' + res.error} "
                      f"({res.e2e:.2f} s)")

        levels = []
        for conc in args.levels:
            n = args.requests_per_level if args.requests_per_level > 0 else max(4, 2 * conc)
            what = "requests" if args.workload == "single" else f"conversations of {args.turns}"
            log(args, f"  concurrency {conc}: {n} {what} ...")
            stagger = 0.0
            if args.ramp and warmups and warmups[-1]["ok"]:
                stagger = warmups[-1]["e2e_s"] / conc
            summary, next_index = await run_level(args, client, side, base, model, images,
                                                  conc, n, next_index, stagger_s=stagger)
            levels.append(summary)
            log(args, f"    {summary['completed']} ok, {summary['failed']} failed, "
                      f"{summary['duration_s']:.2f} s, {summary['request_throughput']:.3f} req/s, "
                      f"{summary['output_throughput']:.2f} out tok/s")
            for f in summary["failures"][:5]:
                log(args, f"    failure {f}")
    return {"model": model, "served_model_ids": served_ids, "warmup": warmups, "levels": levels,
            "base_url": base, "server_command": server.cmd if server else None}


def workload_title(args: argparse.Namespace) -> str:
    if args.request_file:
        return f"{Path(args.request_file).name} ({len(args.recorded)} recorded requests)"
    img = "no image" if args.no_image else f"{args.size[0]}x{args.size[1]} JPEG"
    if not args.no_image and args.images_per_request > 1:
        img = f"{args.images_per_request} x {img}s"
    work = "" if args.workload == "single" else f"{args.turns}-turn conversations, "
    return f"{work}{img}, {args.prompt_words} filler words, {args.output_len} output tokens"


def report(args: argparse.Namespace, runs: list[dict]) -> int:
    """The table(s) on stdout, the JSON file and the plot."""
    many = len(runs) > 1
    notes = []
    for r in runs:
        levels = r["levels"]
        if many:
            print(f"\n**{r['name']}** (`vlm serve {r['serve_args']}`):\n")
        print(markdown_table(levels))
        prefix = f"{r['name']}: " if many else ""
        short = sum(l["requests_not_output_len"] for l in levels)
        if short:
            notes.append(f"{prefix}{short} completed requests did not generate exactly "
                         f"{args.output_len} tokens (does the server honour ignore_eos?)")
        missing = sum(l["missing_usage"] for l in levels)
        if missing:
            notes.append(f"{prefix}{missing} replies had no usage chunk; their token counts are "
                         f"content chunks")
        failed = sum(l["failed"] for l in levels)
        if failed:
            notes.append(f"{prefix}{failed} requests failed (messages in the JSON file)")
    for nline in notes:
        print(f"\nNote: {nline}")

    model = runs[0]["model"]
    title = (f"vlm serve — {model} — {workload_title(args)} — "
             f"{_dt.date.today().isoformat()}")
    report_json = {
        "command": [sys.executable] + sys.argv,
        "command_line": shlex.join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "date": _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "repo_commit": git_commit(),
        "config": {k: v for k, v in vars(args).items() if k not in ("levels", "size", "recorded")},
        "percentile_method": "numpy.percentile, linear interpolation",
        "notes": notes,
    }
    if many:
        report_json["variants"] = runs
    else:
        report_json.update(runs[0])
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(report_json, indent=1))
        log(args, f"wrote {args.out_json}")
    if args.out_png:
        try:
            if many:
                plot_variants(runs, args.out_png, title)
            else:
                plot(runs[0]["levels"], args.out_png, title)
            log(args, f"wrote {args.out_png}")
        except Exception as e:  # noqa: BLE001 - the table and JSON are already out
            print(f"bench_serve: could not draw {args.out_png}: {type(e).__name__}: {e}",
                  file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    runs = []
    for name, extra in args.variants or [("vlm", "")]:
        server = None
        serve_args = (args.serve_args + " " + extra).strip()
        if args.vlm:
            log_path = args.server_log or tempfile.mkstemp(prefix="vlm-serve-", suffix=".log")[1]
            if args.server_log and args.variants:
                log_path = f"{args.server_log}.{name}"
            server = ServerProcess(args.vlm, args.model, serve_args, log_path)
            log(args, f"bench_serve: started {shlex.join(server.cmd)} (log: {log_path})")
            try:
                args.base_url = server.wait_url(args.startup_timeout)
            except SystemExit:
                server.stop()
                raise
        try:
            result = asyncio.run(run(args, server))
        except KeyboardInterrupt:
            return 130
        finally:
            if server is not None:
                server.stop()
        result["name"] = name
        result["serve_args"] = serve_args
        runs.append(result)
    return report(args, runs)


if __name__ == "__main__":
    sys.exit(main())
