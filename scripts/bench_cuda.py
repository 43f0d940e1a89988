#!/usr/bin/env python3
"""vlm on the GPU against transformers generate on the same GPU, in one run.

    python3 scripts/bench_cuda.py --vlm build/device/bin/vlm --out OUT

Run by scripts/cuda_device_check.sh on a machine with an NVIDIA GPU (needs torch and
transformers). Steps, all in this one process:
  1. the GPU's measured limits: device-to-device copy bandwidth (bytes read + written) and the
     cuBLAS BF16 matrix-product rate (torch.matmul, 8192^3), each the median of 10 timed runs;
  2. a random-weight Qwen3-VL-8B (transformers' own init, bfloat16, on the GPU), saved with
     save_pretrained for vlm to load;
  3. transformers generate (bfloat16, sdpa attention, use_cache, greedy, EOS ignored) on random
     prompts of 512 tokens at 1, 8, 32 and 128 concurrent sequences: output tok/s of the decode
     steps, (B·(N−1)) / (t(N) − t(1)), medians of 3 runs;
  4. `vlm bench --device cuda` on the saved checkpoint: prefill 512 and 2048, decode 128 after 512,
     vision 448x448 and 1280x960, batched decode at 8, 32 and 128 (medians of 3);
  5. prefill 2048 and single-stream decode again with --quant int8 (weight-only INT8) and
     --quant fp8 (E4M3 products);
  6. the ratios against those limits and transformers, as a table ($OUT/bench_table.md) and JSON
     ($OUT/bench.json).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

PROMPT, GEN, BATCHES, REPS = 512, 128, (1, 8, 32, 128), 3
# vlm bench's own JSON files go here (their contents are copied into $OUT/bench.json), so that
# $OUT holds only the few files a reader needs.
WORK = Path("/tmp/vlm-bench-work")


def timed(fn, reps: int = 10, warmup: int = 3) -> float:
    """Median seconds of fn() over reps runs, after warmup runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gpu_limits() -> dict:
    n = 1 << 30  # 2 GiB of bf16 per buffer
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    t = timed(lambda: b.copy_(a))
    bw = 2 * a.numel() * 2 / t  # bytes read + written
    del a, b
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    t = timed(lambda: x @ y)
    del x, y
    torch.cuda.empty_cache()
    return {"membw_bytes_s": bw, "bf16_peak_flop_s": 2 * m ** 3 / t,
            "gpu": torch.cuda.get_device_name(0)}


def make_model():
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    text = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, max_position_embeddings=262144, rms_norm_eps=1e-6,
                rope_theta=5000000.0, hidden_act="silu", attention_bias=False,
                tie_word_embeddings=False,
                rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20],
                              "mrope_interleaved": True})
    vision = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                  in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  out_hidden_size=4096, num_position_embeddings=2304,
                  deepstack_visual_indexes=[8, 16, 24], hidden_act="gelu_pytorch_tanh")
    cfg = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=151655,
                        video_token_id=151656, vision_start_token_id=151652,
                        vision_end_token_id=151653, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3VLForConditionalGeneration(cfg).to(torch.bfloat16)
    model.eval()
    return model


def hf_generate(model, batches) -> dict:
    """Decode-step output tok/s of transformers generate per concurrency."""
    out = {}
    g = torch.Generator(device="cuda").manual_seed(1)
    for bsz in batches:
        ids = torch.randint(0, 150000, (bsz, PROMPT), device="cuda", generator=g)
        mask = torch.ones_like(ids)

        def run(n):
            with torch.inference_mode():
                model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, use_cache=True,
                               pad_token_id=0)
        t1 = timed(lambda: run(1), reps=REPS, warmup=1)
        tn = timed(lambda: run(GEN), reps=REPS, warmup=1)
        out[bsz] = {"decode_tok_s": bsz * (GEN - 1) / (tn - t1),
                    "end_to_end_tok_s": bsz * GEN / tn, "prefill_s": t1, "total_s": tn}
        print(f"transformers batch {bsz}: {out[bsz]['decode_tok_s']:.1f} tok/s decode", flush=True)
    return out


def vlm_bench(vlm: str, ckpt: Path) -> dict:
    js = WORK / "vlm_bench.json"
    cmd = [vlm, "bench", "-m", str(ckpt), "--device", "cuda", "--prefill-chunk", "2048",
           "-p", "512,2048", "-n", str(GEN), "--gen-prompt", str(PROMPT),
           "--batch", ",".join(str(b) for b in BATCHES if b > 1),
           "--synthetic-image", "448x448", "--synthetic-image", "1280x960",
           "-r", str(REPS), "--json", str(js)]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(js.read_text())


def vlm_bench_quant(vlm: str, ckpt: Path, quant: str) -> dict:
    """Prefill 2048 and single-stream decode with --quant int8 (weight-only) or fp8 (E4M3)."""
    js = WORK / f"vlm_bench_{quant}.json"
    cmd = [vlm, "bench", "-m", str(ckpt), "--device", "cuda", "--quant", quant,
           "--prefill-chunk", "2048", "-p", "2048", "-n", str(GEN), "--gen-prompt", str(PROMPT),
           "-r", str(REPS), "--json", str(js)]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(js.read_text())


def median_of(results, kind, size):
    for r in results:
        if r["kind"] == kind and r.get("size") == size:
            return r["median"]
    return None


def report(res: dict) -> list[str]:
    """The ratios as markdown table lines, from the limits, transformers and vlm runs."""
    v = res["vlm"]
    rs = v["results"]
    lim = res["limits"]
    wbytes = v.get("decode_weight_bytes")
    rows = []
    dec = median_of(rs, "decode", GEN)
    if dec and wbytes:
        share = dec * wbytes / lim["membw_bytes_s"]
        rows.append(("decode, 1 stream", f"{dec:.1f} tok/s", f"{100 * share:.0f}% of "
                     f"{lim['membw_bytes_s'] / 1e12:.2f} TB/s", ">= 70%"))
    L, nh, hd, H, V = 36, 32, 128, 4096, 151936
    for p in (512, 2048):
        tps = median_of(rs, "prefill", p)
        if tps and wbytes:
            linear = (wbytes / 2 - V * H)  # bf16 linear params less the head (last row only)
            flops = 2 * linear * p + 4 * L * nh * hd * p * (p + 1) / 2
            tf = flops * tps / p
            rows.append((f"prefill {p}", f"{tps:.0f} tok/s",
                         f"{100 * tf / lim['bf16_peak_flop_s']:.0f}% of "
                         f"{lim['bf16_peak_flop_s'] / 1e12:.0f} TFLOP/s", ">= 50%"))
    for r in rs:
        if r["kind"] == "vision_encode":
            rows.append((f"vision encode {r['image']} ({r['tokens']} tokens)",
                         f"{r['median']:.1f} ms", "", ""))
    for b in BATCHES:
        mine = dec if b == 1 else median_of(rs, "batched_decode", b)
        hf = res["transformers"].get(b, res["transformers"].get(str(b)))["decode_tok_s"]
        if mine:
            rows.append((f"output tok/s at {b}", f"{mine:.0f} vs {hf:.0f}",
                         f"{mine / hf:.2f}x transformers",
                         ">= 3x" if b == 1 else (">= 10x" if b == 32 else "")))
    for quant in ("int8", "fp8"):
        vq = res.get(f"vlm_{quant}")
        if not vq:
            continue
        decq = median_of(vq["results"], "decode", GEN)
        if decq:
            share = decq * vq["decode_weight_bytes"] / lim["membw_bytes_s"]
            rows.append((f"decode, 1 stream, --quant {quant}", f"{decq:.1f} tok/s",
                         f"{100 * share:.0f}% of bandwidth", ""))
        preq = median_of(vq["results"], "prefill", 2048)
        if preq:
            rows.append((f"prefill 2048, --quant {quant}", f"{preq:.0f} tok/s", "", ""))
    table = ["| measure | vlm | share / ratio | target |", "|---|---|---|---|"]
    return table + [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]


def save(res: dict, out: Path) -> None:
    """Writes what is measured so far (a run cut short by its time limit still leaves it)."""
    (out / "bench.json").write_text(json.dumps(res, indent=1, default=str))
    if "vlm" in res:
        (out / "bench_table.md").write_text("\n".join(report(res)) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vlm", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ckpt", type=Path, default=Path("/tmp/qwen3vl-8b-random"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    res = {"limits": gpu_limits()}
    print(json.dumps(res["limits"]), flush=True)
    save(res, a.out)
    model = make_model()
    model.save_pretrained(a.ckpt, max_shard_size="5GB")
    res["transformers"] = hf_generate(model, BATCHES)
    save(res, a.out)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    res["vlm"] = vlm_bench(a.vlm, a.ckpt)
    save(res, a.out)
    for quant in ("int8", "fp8"):
        try:
            res[f"vlm_{quant}"] = vlm_bench_quant(a.vlm, a.ckpt, quant)
        except subprocess.CalledProcessError as e:  # keep the rest of the table
            print(f"--quant {quant} failed: {e}", flush=True)
        save(res, a.out)
    print("\n".join(report(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
