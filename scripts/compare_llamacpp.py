#!/usr/bin/env python3
"""Side-by-side CPU benchmark: vlm against llama.cpp, same machine, same threads, one run.

It neither contains nor builds llama.cpp: give it the path of a llama.cpp build's `llama-bench`
(and `llama-mtmd-cli` for the vision encoder) and GGUF files of the same shapes as vlm's
checkpoint. Each round runs every pair once, alternating which engine goes first, so drift on a
noisy machine hits both; the table shows medians over the rounds and the vlm / llama.cpp ratio.

  python3 scripts/compare_llamacpp.py --vlm build/tools/cli/vlm --model /work/ckpt-2b \
      --llama-bench ~/llama-build/bin/llama-bench \
      --pair "bf16=/work/gguf/qwen3vl-2b-bf16.gguf" \
      --pair "int8=/work/gguf/qwen3vl-2b-q8_0.gguf=--quant int8" \
      -p 128 -n 32 -t 2 --rounds 3 \
      --mtmd-cli ~/llama-build/bin/llama-mtmd-cli --mmproj /work/gguf/mmproj.gguf \
      --image /work/bench-images/astronaut_448x448.jpg

A pair is LABEL=GGUF[=EXTRA VLM FLAGS]. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(cmd: list[str]) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"compare_llamacpp: {shlex.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout + p.stderr


def llama_bench(bin_: str, gguf: str, p: int, n: int, t: int) -> dict[str, float]:
    out = run([bin_, "-m", gguf, "-p", str(p), "-n", str(n), "-t", str(t), "-r", "1", "-o", "json"])
    rows = json.loads(out[out.index("["): out.rindex("]") + 1])
    res = {}
    for r in rows:
        if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0:
            res["prefill"] = float(r["avg_ts"])
        if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0:
            res["decode"] = float(r["avg_ts"])
    return res


def vlm_bench(bin_: str, model: str, p: int, n: int, t: int, extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        js = Path(d) / "bench.json"
        run([bin_, "bench", "-m", model, "-p", str(p), "-n", str(n), "-r", "1", "-t", str(t),
             "--json", str(js), *extra])
        j = json.loads(js.read_text())
    return {"prefill": float(j["prefill_tok_s_median"]), "decode": float(j["decode_tok_s_median"])}


def llama_vision_ms(bin_: str, gguf: str, mmproj: str, image: str, t: int) -> float:
    out = run([bin_, "-m", gguf, "--mmproj", mmproj, "--image", image, "-p", "Describe the image.",
               "-n", "1", "-t", str(t), "--temp", "0"])
    # Older builds print one "image slice encoded in N ms" per slice, newer ones
    # "mtmd batch encoding done in N ms".
    m = re.findall(r"(?:image slice encoded|mtmd batch encoding done) in (\d+(?:\.\d+)?) ms", out)
    if not m:
        sys.exit("compare_llamacpp: no image encoding time in llama-mtmd-cli's output")
    return sum(float(x) for x in m)


def vlm_vision_ms(bin_: str, model: str, image: str, t: int) -> float:
    # `vlm bench --image` prints | image | tokens | resized | decode+pre ms | encode ms | encode min |
    out = run([bin_, "bench", "-m", model, "--image", image, "-r", "1", "-t", str(t)])
    name = Path(image).name
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] == name:
            return float(cells[4])
    sys.exit(f"compare_llamacpp: no row for {name} in vlm bench's output:\n{out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vlm", required=True)
    ap.add_argument("--model", required=True, help="vlm's checkpoint directory")
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--pair", action="append", required=True, help="LABEL=GGUF[=EXTRA VLM FLAGS]")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens")
    ap.add_argument("-n", type=int, default=32, help="generated tokens")
    ap.add_argument("-t", type=int, default=2, help="threads, both engines")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mtmd-cli")
    ap.add_argument("--mmproj")
    ap.add_argument("--image", action="append", default=[])
    ap.add_argument("--out-json", default="")
    a = ap.parse_args()

    pairs = []
    for spec in a.pair:
        parts = spec.split("=", 2)
        if len(parts) < 2:
            sys.exit(f"compare_llamacpp: --pair {spec!r} is not LABEL=GGUF[=FLAGS]")
        pairs.append((parts[0], parts[1], shlex.split(parts[2]) if len(parts) == 3 else []))
    vision = bool(a.image)
    if vision and not (a.mtmd_cli and a.mmproj):
        sys.exit("compare_llamacpp: --image needs --mtmd-cli and --mmproj")

    samples: dict[tuple[str, str, str], list[float]] = {}

    def add(key, v):
        samples.setdefault(key, []).append(v)

    for r in range(a.rounds):
        for label, gguf, extra in pairs:
            order = ["llama", "vlm"] if r % 2 == 0 else ["vlm", "llama"]
            for who in order:
                res = (llama_bench(a.llama_bench, gguf, a.p, a.n, a.t) if who == "llama"
                       else vlm_bench(a.vlm, a.model, a.p, a.n, a.t, extra))
                for k, v in res.items():
                    add((label, k, who), v)
            print(f"round {r + 1}/{a.rounds} {label}: done", file=sys.stderr)
        for img in a.image:
            gguf = pairs[0][1]
            order = ["llama", "vlm"] if r % 2 == 0 else ["vlm", "llama"]
            for who in order:
                v = (llama_vision_ms(a.mtmd_cli, gguf, a.mmproj, img, a.t) if who == "llama"
                     else vlm_vision_ms(a.vlm, a.model, img, a.t))
                add((Path(img).name, "vision encode ms", who), v)

    rows = []
    print(f"| pair | metric | vlm | llama.cpp | vlm / llama.cpp |")
    print("|---|---|---|---|---|")
    for (label, metric, who) in samples:
        if who != "vlm":
            continue
        v = statistics.median(samples[(label, metric, "vlm")])
        l = statistics.median(samples[(label, metric, "llama")])
        # Ratios are "how many times faster vlm is": tok/s divide, milliseconds invert.
        ratio = l / v if "ms" in metric else v / l
        unit = "" if "ms" in metric else " tok/s"
        print(f"| {label} | {metric} | {v:.2f}{unit} | {l:.2f}{unit} | {ratio:.2f}x |")
        rows.append({"pair": label, "metric": metric, "vlm": samples[(label, metric, "vlm")],
                     "llama": samples[(label, metric, "llama")], "vlm_median": v, "llama_median": l,
                     "speedup": ratio})
    print(f"{a.rounds} rounds, medians; threads {a.t}, prompt {a.p}, generated {a.n}")
    if a.out_json:
        Path(a.out_json).write_text(json.dumps({"command": sys.argv, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
