#!/usr/bin/env python3
"""Side-by-side CPU benchmark: vlm against llama.cpp, same machine, same threads, one run.

It neither contains nor builds llama.cpp: give it the path of a llama.cpp build's `llama-bench`
(and `llama-mtmd-cli` for the vision encoder) and GGUF files of the same shapes as vlm's
checkpoint. Each round runs every pair once, alternating which engine goes first, so drift on a
noisy machine hits both; the table shows medians over the rounds and the vlm / llama.cpp ratio.

  python3 scripts/compare_llamacpp.py --vlm build/tools/cli/vlm --model CKPT_DIR \\
      --llama-bench LLAMA_BUILD/bin/llama-bench \\
      --pair "bf16=GGUF_DIR/qwen3vl-2b-bf16.gguf" \\
      --pair "int8=GGUF_DIR/qwen3vl-2b-q8_0.gguf=--quant int8" \\
      -p 128,512,2048 -n 128 -t 2 --rounds 3 \\
      --mtmd-cli LLAMA_BUILD/bin/llama-mtmd-cli --mmproj GGUF_DIR/mmproj.gguf \\
      --image IMAGES_DIR/astronaut_448x448.jpg \\
      --image IMAGES_DIR/retina_1280x960.jpg

A pair is LABEL=GGUF[=EXTRA VLM FLAGS]. With --same-file (no --model) vlm runs each pair's GGUF
itself, the same file llama.cpp runs:

  python3 scripts/compare_llamacpp.py --vlm build/tools/cli/vlm --same-file \\
      --llama-bench LLAMA_BUILD/bin/llama-bench \\
      --pair "Q4_K_M=GGUF_DIR/qwen3vl-2b-q4_k_m.gguf" --pair "Q8_0=GGUF_DIR/qwen3vl-2b-q8_0.gguf" \\
      -p 128,512 -n 64 -t 2 --rounds 3

Standard library only.

What is matched:
- Prefill: llama-bench `pp P` against `vlm bench -p P` (a P-token prompt from an empty cache).
- Decode: llama-bench `tg N` decodes N tokens one at a time after --gen-depth tokens of context
  (`-d`, default 0: from a single start token); vlm gets `-n N --gen-prompt max(depth, 1)`, i.e.
  N decode steps after a prompt of that length. Both report tokens per second of those N steps.
- Vision: llama-mtmd-cli's own timer around its image encoder ("mtmd batch encoding done in N ms",
  or "image slice encoded in N ms" per slice in older builds) against `vlm bench --image`'s
  vision-encode median; both engines' image token counts are printed beside it (llama.cpp's from
  "n_tokens_batch = T" while it decodes the image, logged at -lv 4), and a mismatch is flagged:
  the two preprocessors may resize to different token counts (--mtmd-args / --vlm-vision-args
  can align the pixel budgets, e.g. llama.cpp's --image-min-tokens / --image-max-tokens).
Each vlm run's full JSON (figures, peak RSS, decode weight bytes, commit) goes into --out-json.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path


def run(cmd: list[str]) -> tuple[str, str]:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"compare_llamacpp: {shlex.join(cmd)} failed ({p.returncode}):\n"
                 f"{p.stderr[-2000:]}")
    return p.stdout, p.stderr


def sizes(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of positive integers")
    return out


def llama_bench(bin_: str, gguf: str, a: argparse.Namespace) -> dict[str, float]:
    """tok/s of `prefill P` for each -p and `decode N` for each -n (one repetition)."""
    base = [bin_, "-m", gguf, "-t", str(a.t), "-r", "1", "-o", "json"]
    calls = [["-p", ",".join(map(str, a.p)), "-n", "0"],
             ["-p", "0", "-n", ",".join(map(str, a.n)), "-d", str(a.gen_depth)]]
    res = {}
    for extra in calls:
        out, _ = run(base + extra)
        for r in json.loads(out[out.index("["): out.rindex("]") + 1]):
            if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0:
                res[f"prefill {r['n_prompt']}"] = float(r["avg_ts"])
            if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0:
                res[f"decode {r['n_gen']}"] = float(r["avg_ts"])
    return res


def vlm_bench(bin_: str, model: str, args: list[str], t: int, runs: list) -> dict:
    """`vlm bench ... --json -` (one repetition after its warmup); keeps the JSON in `runs`."""
    out, _ = run([bin_, "bench", "-m", model, "-r", "1", "-t", str(t), "--json", "-", *args])
    j = json.loads(out)
    runs.append(j)
    return j


def vlm_text(bin_: str, model: str, a: argparse.Namespace, extra: list[str], runs: list):
    j = vlm_bench(bin_, model, ["-p", ",".join(map(str, a.p)), "-n", ",".join(map(str, a.n)),
                                "--gen-prompt", str(max(a.gen_depth, 1)), *extra], a.t, runs)
    res = {}
    for r in j["results"]:
        if r["kind"] in ("prefill", "decode"):
            res[f"{r['kind']} {r['size']}"] = float(r["median"])
    return res


def llama_vision(bin_: str, gguf: str, mmproj: str, image: str, a) -> tuple[float, int | None]:
    """(encoder ms, image tokens or None) from one llama-mtmd-cli run."""
    # -lv 4 (trace): the image token count is logged by mtmd-helper at INFO, which llama.cpp's
    # common logger shows only from verbosity 4 on.
    out, err = run([bin_, "-m", gguf, "--mmproj", mmproj, "--image", image, "-p",
                    "Describe the image.", "-n", "1", "-t", str(a.t), "--temp", "0", "-lv", "4",
                    *shlex.split(a.mtmd_args)])
    text = out + err
    ms = re.findall(r"(?:image slice encoded|mtmd batch encoding done) in (\d+(?:\.\d+)?) ms", text)
    if not ms:
        sys.exit("compare_llamacpp: no image encoding time in llama-mtmd-cli's output")
    tokens = re.findall(r"decoding image batch \d+/\d+, n_tokens_batch = (\d+)", text)
    return sum(float(x) for x in ms), (sum(int(x) for x in tokens) if tokens else None)


def vlm_vision(bin_: str, model: str, image: str, a, runs: list,
               mmproj: list[str]) -> tuple[float, int]:
    j = vlm_bench(bin_, model, ["--image", image, *mmproj, *shlex.split(a.vlm_vision_args)], a.t,
                  runs)
    for r in j["results"]:
        if r["kind"] == "vision_encode":
            return float(r["median"]), int(r["tokens"])
    sys.exit(f"compare_llamacpp: no vision_encode row in vlm bench's JSON for {image}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vlm", required=True)
    ap.add_argument("--model", help="vlm's checkpoint directory (not with --same-file)")
    ap.add_argument("--same-file", action="store_true",
                    help="vlm runs each pair's GGUF itself (and the vision runs the first pair's "
                         "with --mmproj), the very bytes llama.cpp runs")
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--pair", action="append", required=True, help="LABEL=GGUF[=EXTRA VLM FLAGS]")
    ap.add_argument("-p", type=sizes, default=[128], help="prompt sizes, comma list (prefill)")
    ap.add_argument("-n", type=sizes, default=[32], help="decode lengths, comma list")
    ap.add_argument("--gen-depth", type=int, default=0,
                    help="context before the decode tokens (llama-bench -d; vlm --gen-prompt)")
    ap.add_argument("-t", type=int, default=2, help="threads, both engines")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mtmd-cli")
    ap.add_argument("--mmproj")
    ap.add_argument("--image", action="append", default=[])
    ap.add_argument("--mtmd-args", default="", help="extra llama-mtmd-cli flags for --image runs")
    ap.add_argument("--vlm-vision-args", default="",
                    help="extra vlm bench flags for --image runs (e.g. --max-pixels N)")
    ap.add_argument("--out-json", default="")
    a = ap.parse_args()
    if a.same_file == bool(a.model):
        sys.exit("compare_llamacpp: give --model CKPT_DIR or --same-file (one of them)")

    pairs = []
    for spec in a.pair:
        parts = spec.split("=", 2)
        if len(parts) < 2:
            sys.exit(f"compare_llamacpp: --pair {spec!r} is not LABEL=GGUF[=FLAGS]")
        pairs.append((parts[0], parts[1], shlex.split(parts[2]) if len(parts) == 3 else []))
    if a.image and not (a.mtmd_cli and a.mmproj):
        sys.exit("compare_llamacpp: --image needs --mtmd-cli and --mmproj")

    samples: dict[tuple[str, str, str], list[float]] = {}
    tokens: dict[tuple[str, str], set] = {}  # (image, engine) → image token counts seen
    vlm_runs: list[dict] = []

    def add(key, v):
        samples.setdefault(key, []).append(v)

    for r in range(a.rounds):
        order = ["llama", "vlm"] if r % 2 == 0 else ["vlm", "llama"]
        for label, gguf, extra in pairs:
            for who in order:
                res = (llama_bench(a.llama_bench, gguf, a) if who == "llama"
                       else vlm_text(a.vlm, gguf if a.same_file else a.model, a, extra,
                                     vlm_runs))
                for k, v in res.items():
                    add((label, k, who), v)
            print(f"round {r + 1}/{a.rounds} {label}: done", file=sys.stderr)
        for img in a.image:
            name = Path(img).name
            for who in order:
                if who == "llama":
                    ms, n = llama_vision(a.mtmd_cli, pairs[0][1], a.mmproj, img, a)
                else:
                    ms, n = vlm_vision(a.vlm, pairs[0][1] if a.same_file else a.model, img,
                                       a, vlm_runs,
                                       ["--mmproj", a.mmproj] if a.same_file else [])
                add((name, "vision encode ms", who), ms)
                tokens.setdefault((name, who), set()).add(n)
            print(f"round {r + 1}/{a.rounds} {name}: done", file=sys.stderr)

    rows = []
    print("| pair | metric | vlm | llama.cpp | vlm / llama.cpp |")
    print("|---|---|---|---|---|")
    for (label, metric, who) in samples:
        if who != "vlm" or (label, metric, "llama") not in samples:
            continue
        v = statistics.median(samples[(label, metric, "vlm")])
        ll = statistics.median(samples[(label, metric, "llama")])
        # Ratios are "how many times faster vlm is": tok/s divide, milliseconds invert.
        ratio = ll / v if "ms" in metric else v / ll
        unit = "" if "ms" in metric else " tok/s"
        print(f"| {label} | {metric} | {v:.2f}{unit} | {ll:.2f}{unit} | {ratio:.2f}x |")
        row = {"pair": label, "metric": metric, "vlm": samples[(label, metric, "vlm")],
               "llama": samples[(label, metric, "llama")], "vlm_median": v, "llama_median": ll,
               "speedup": ratio}
        if "vision" in metric:
            vt, lt = tokens.get((label, "vlm"), {None}), tokens.get((label, "llama"), {None})
            vt_s = "/".join(str(x) for x in sorted(vt, key=str))
            lt_s = "/".join(str(x) for x in sorted(lt, key=str))
            same = vt == lt and None not in vt
            verdict = ("same" if same else "llama.cpp printed no count" if None in lt
                       else "DIFFERENT: not apples to apples")
            print(f"| {label} | image tokens | {vt_s} | {lt_s} | {verdict} |")
            row.update({"vlm_image_tokens": sorted(vt, key=str),
                        "llama_image_tokens": sorted(lt, key=str), "same_tokens": same})
        rows.append(row)
    print(f"{a.rounds} rounds, medians; threads {a.t}; prompts {','.join(map(str, a.p))}; "
          f"decode {','.join(map(str, a.n))} after {a.gen_depth} tokens of context")
    if a.out_json:
        Path(a.out_json).write_text(json.dumps(
            {"command": sys.argv, "rows": rows, "vlm_runs": vlm_runs}, indent=1))


if __name__ == "__main__":
    main()
