#!/usr/bin/env python3
"""Scaling out, measured with the field's own load generator: a rate sweep of image requests
(GuideLLM, constant request rates) against one `vlm serve` replica and against two behind the
Shepherd Model Gateway (`smg`, --policy), each replica pinned to its own CPU
(`taskset`, `-t 1`), then the same two set-ups under scripts/bench_serve.py's closed-loop
concurrency sweep. Reports per rate the achieved requests/s, output tokens/s, TTFT and ITL p50/p99
and errors, the client's and the router's own CPU time beside them, and the scaling: the
throughput each set-up sustains with TTFT p99 within a bound (the bound: --ttft-factor times the
single replica's TTFT p99 at the lowest rate), their ratio. Writes a JSON file and one plot.

    python3 scripts/bench_scaleout.py --vlm build/tools/cli/vlm --guidellm GUIDELLM_VENV/bin/guidellm \\
        --smg VENV/bin/smg --bench-python BENCH_VENV/bin/python [--rates 10,20,40,60,80,100] \\
        [--seconds 20] [-m CKPT_DIR --serve-args "--quant int8"] [--out-json F] [--out-png F]

GuideLLM (PyPI guidellm, with pillow) and smg (PyPI smg) live in venvs of their own; BENCH_VENV has
scripts/requirements-bench.txt. Nothing else may run on the machine meanwhile.
"""

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from router_demo import Replica, Router, cpu_seconds  # beside this script

REPO = Path(__file__).resolve().parents[1]


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Setup:
    """`n` vlm replicas pinned to CPUs 0.., behind smg when there is more than one."""

    def __init__(self, args, workdir, n):
        self.children, self.router = [], None
        try:
            for i in range(n):
                # A large checkpoint on one pinned thread loads (and quantizes) slowly.
                self.children.append(Replica(args.vlm, workdir, f"{n}-{i}", args.model, cpu=i,
                                             extra=args.serve_args.split(), start_timeout=300))
            self.url = self.children[0].url
            if n > 1:
                self.router = Router(args.smg, workdir, [r.url for r in self.children],
                                     args.policy)
                self.url = self.router.url
        except BaseException:
            self.stop()
            raise

    def router_cpu(self):
        return cpu_seconds(self.router.proc.pid) if self.router else 0.0

    def stop(self):
        for child in ([self.router] if self.router else []) + self.children:
            child.stop()


def guidellm_sweep(args, url, out_json):
    # One worker process is plenty for these rates; GuideLLM's default (10 processes, each
    # importing its stack at every rate's start) costs the replicas CPU on a small machine.
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               GUIDELLM__MAX_WORKER_PROCESSES=str(args.client_workers))
    w, h = args.image_size.split("x")
    cmd = [args.guidellm, "run",
           # vlm takes stream_options.continuous_usage_stats; GuideLLM's default body is sent as is.
           "--backend", f"kind=openai_http,target={url}",
           "--tokenizer", f"kind=huggingface_auto,model={args.tokenizer}",
           "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                     f"output_tokens={args.output_tokens}",
           "--data", f"kind=synthetic_image,width={w},height={h},format=jpeg",
           "--profile", "kind=constant", "--override", "profile.rate", args.rates,
           "--constraint", f"kind=max_duration,seconds={args.seconds}",
           "--output", f"kind=json,path={out_json}", "--disable-console-interactive"]
    c0, t0 = children_cpu(), time.monotonic()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cpu, wall = children_cpu() - c0, time.monotonic() - t0
    points = []
    for b in json.loads(Path(out_json).read_text())["benchmarks"]:
        m = b["metrics"]

        def pct(name, p):
            return m[name]["successful"]["percentiles"][p]

        totals = m["request_totals"]
        points.append({
            "rate": b["config"]["strategy"]["rate"],
            "req_per_s": m["requests_per_second"]["successful"]["mean"],
            "output_tok_per_s": m["output_tokens_per_second"]["successful"]["mean"],
            "ttft_ms_p50": pct("time_to_first_token_ms", "p50"),
            "ttft_ms_p99": pct("time_to_first_token_ms", "p99"),
            "itl_ms_p50": pct("inter_token_latency_ms", "p50"),
            "itl_ms_p99": pct("inter_token_latency_ms", "p99"),
            "ok": totals["successful"], "errored": totals["errored"],
            "incomplete": totals["incomplete"]})
    return points, cpu, wall


def bench_serve_sweep(args, url, out_json, workdir):
    cmd = [args.bench_python, str(REPO / "scripts/bench_serve.py"), "--base-url", url,
           "--concurrency", args.concurrency, "--output-len", str(args.output_tokens),
           "--image-size", args.image_size, "--requests-per-level", str(args.requests_per_level),
           "--out-json", out_json, "--out-png", "", "--quiet"]
    c0 = children_cpu()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=workdir)
    cpu = children_cpu() - c0
    return json.loads(Path(out_json).read_text()), cpu


def sustained(points, bound, seconds):
    """The highest achieved req/s at a rate the set-up kept up with, with TTFT p99 within `bound`
    (ms). Kept up: no errors, at least 90% of the offered requests sent in the `seconds` window,
    and at most a quarter of them still unfinished at its end (a growing backlog leaves more).
    When only the bound is crossed, the step to that rate is interpolated on TTFT p99."""
    best, prev = 0.0, None
    for p in sorted(points, key=lambda p: p["rate"]):
        sent = p["ok"] + p["incomplete"]
        keeps_up = (p["errored"] == 0 and sent >= 0.9 * p["rate"] * seconds and
                    p["incomplete"] <= 0.25 * sent)
        if keeps_up and p["ttft_ms_p99"] <= bound:
            best = max(best, p["req_per_s"])
        elif keeps_up and prev is not None:
            f = (bound - prev["ttft_ms_p99"]) / (p["ttft_ms_p99"] - prev["ttft_ms_p99"])
            best = max(best, prev["req_per_s"] + f * (p["req_per_s"] - prev["req_per_s"]))
            break
        else:
            break
        prev = p
    return best


def plot(results, bound, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in results.items():
        pts = sorted(r["guidellm"], key=lambda p: p["rate"])
        x = [p["req_per_s"] for p in pts]
        axes[0].plot(x, [p["ttft_ms_p99"] for p in pts], "o-", label=f"{name}: TTFT p99")
        axes[0].plot(x, [p["ttft_ms_p50"] for p in pts], "o--", label=f"{name}: TTFT p50")
        axes[1].plot(x, [p["itl_ms_p99"] for p in pts], "o-", label=f"{name}: ITL p99")
        axes[1].plot(x, [p["itl_ms_p50"] for p in pts], "o--", label=f"{name}: ITL p50")
    axes[0].axhline(bound, color="grey", lw=0.8, ls=":", label=f"bound {bound:.0f} ms")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("achieved requests/s (GuideLLM, constant rate)")
    axes[0].set_ylabel("ms")
    axes[0].set_title("time to first token")
    axes[1].set_xlabel("achieved requests/s")
    axes[1].set_ylabel("ms")
    axes[1].set_title("inter-token latency")
    for a in axes:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle("vlm: 1 replica vs 2 behind smg, one vCPU each, image requests (GuideLLM)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vlm", required=True)
    ap.add_argument("--guidellm", required=True, help="the guidellm executable")
    ap.add_argument("--smg", required=True, help="the smg executable")
    ap.add_argument("--bench-python", required=True,
                    help="a Python with scripts/requirements-bench.txt, for scripts/bench_serve.py")
    ap.add_argument("-m", "--model", default="", help="checkpoint (default: the demo model)")
    ap.add_argument("--serve-args", default="", help='more `vlm serve` flags, e.g. "--quant int8"')
    ap.add_argument("--tokenizer", default="",
                    help="a folder with tokenizer.json for GuideLLM (default: the model's)")
    ap.add_argument("--rates", default="10,20,40,60,80,100", help="GuideLLM's constant rates")
    ap.add_argument("--seconds", type=int, default=20, help="per rate")
    ap.add_argument("--client-workers", type=int, default=1, help="GuideLLM's worker processes")
    ap.add_argument("--policy", default="round_robin",
                    help="smg's routing policy (default round_robin: cache_aware keeps requests "
                         "whose text is alike on one replica until 64 more are queued there)")
    ap.add_argument("--concurrency", default="1,2,4,8,16", help="bench_serve.py's levels")
    ap.add_argument("--requests-per-level", type=int, default=200)
    ap.add_argument("--image-size", default="256x256")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--ttft-factor", type=float, default=5.0)
    ap.add_argument("--out-json", default="bench_scaleout.json")
    ap.add_argument("--summarize", action="store_true",
                    help="run nothing: recompute the summary and the plot from --out-json")
    ap.add_argument("--out-png", default="bench_scaleout.png")
    args = ap.parse_args()
    args.tokenizer = args.tokenizer or args.model or str(REPO / "models/tiny-qwen35")
    for k in ("NO_PROXY", "no_proxy"):
        os.environ[k] = ",".join(filter(None, [os.environ.get(k, ""), "127.0.0.1", "localhost"]))
    if args.summarize:
        saved = json.loads(Path(args.out_json).read_text())
        summarize(saved["results"], saved["args"], args.out_json, args.out_png)
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="vlm_scaleout_") as workdir:
        for n in (1, 2):
            name = f"{n} replica" + (f"s behind smg ({args.policy})" if n > 1 else "")
            print(f"{name}: GuideLLM rate sweep {args.rates} req/s, {args.seconds} s each", flush=True)
            setup = Setup(args, workdir, n)
            try:
                r0 = setup.router_cpu()
                points, g_cpu, g_wall = guidellm_sweep(args, setup.url, Path(workdir) / f"g{n}.json")
                r1 = setup.router_cpu()
                print(f"{name}: bench_serve.py concurrency {args.concurrency}", flush=True)
                bs, b_cpu = bench_serve_sweep(args, setup.url, str(Path(workdir) / f"b{n}.json"), workdir)
                r2 = setup.router_cpu()
            finally:
                setup.stop()
            results[name] = {
                "guidellm": points,
                "guidellm_cpu_seconds": round(g_cpu, 1), "guidellm_wall_seconds": round(g_wall, 1),
                "router_cpu_seconds_guidellm": round(r1 - r0, 1),
                "bench_serve": bs.get("levels", bs), "bench_serve_cpu_seconds": round(b_cpu, 1),
                "router_cpu_seconds_bench_serve": round(r2 - r1, 1)}
            for p in points:
                print(f"  rate {p['rate']:6.1f}: {p['req_per_s']:6.1f} req/s, "
                      f"{p['output_tok_per_s']:7.0f} out tok/s, TTFT p50/p99 {p['ttft_ms_p50']:7.1f}/"
                      f"{p['ttft_ms_p99']:7.1f} ms, ITL p50/p99 {p['itl_ms_p50']:5.2f}/{p['itl_ms_p99']:5.2f} ms, "
                      f"ok {p['ok']}, errors {p['errored']}", flush=True)
            print(f"  GuideLLM CPU {g_cpu:.0f} s over {g_wall:.0f} s; smg CPU {r1 - r0:.0f} s", flush=True)
    summarize(results, vars(args), args.out_json, args.out_png)


def summarize(results, run_args, out_json, out_png):
    one = results["1 replica"]
    two = next(r for name, r in results.items() if name.startswith("2 replicas"))
    low = min(one["guidellm"], key=lambda p: p["rate"])
    bound = run_args["ttft_factor"] * low["ttft_ms_p99"]
    s1 = sustained(one["guidellm"], bound, run_args["seconds"])
    s2 = sustained(two["guidellm"], bound, run_args["seconds"])
    summary = {"ttft_p99_bound_ms": round(bound, 1), "sustained_req_per_s_1": round(s1, 3),
               "sustained_req_per_s_2": round(s2, 3), "scaling": round(s2 / s1, 2) if s1 else None}
    print(json.dumps(summary))
    Path(out_json).write_text(json.dumps({"args": run_args, "summary": summary,
                                          "results": results}, indent=2) + "\n")
    if out_png:
        plot(results, bound, out_png)


if __name__ == "__main__":
    main()
