#!/usr/bin/env python3
"""The HTTP front door under many connections: two (or more) `vlm serve` builds side by side.

For each build, in alternating rounds, on one server process per build and round:
  1. streams alone: --streams concurrent streaming chat requests (text, --output-len tokens,
     greedy, ignore_eos), 2 x --streams requests: ITL p50 / p99 and TTFT p50;
  2. the same with --idle idle keep-alive connections open (each made one GET /health and then
     stays silent), plus the server's RSS and the /health latency while they are open;
  1 and 2 alternate --pairs times on the same server (the idle connections are closed after
  each 2), and the ITL percentiles are the medians over the pairs, so that the comparison is
  made under the same load on the machine;
  3. wrk on GET /health (--wrk-connections, --wrk-seconds): requests/s;
  4. wrk on POST /v1/chat/completions with a 1-token reply: requests/s.
Every phase has a deadline; what a build cannot do within it is reported as such (a server
with a fixed thread pool may never get to the streams while idle connections hold its threads).

  BENCH_VENV/bin/python scripts/bench_front_door.py \\
      --build previous=PREV_BUILD/tools/cli/vlm --build new=build/tools/cli/vlm --rounds 2

Needs scripts/requirements-bench.txt (httpx, numpy) and Debian's wrk. The model is the shipped
tiny model unless --model is given: its steps are short, so the transport's share of the
latency is what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_serve  # noqa: E402  (the request and summary code of the serving benchmark)

REPO = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", text, re.M).group(1)) / 1024


def open_idle(port: int, n: int, deadline_s: float) -> tuple[list[socket.socket], int]:
    """n connections that each send GET /health; returns them and how many were answered within
    the deadline (the others stay open too)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.setblocking(False)
        socks.append(s)
    answered = set()
    end = time.monotonic() + deadline_s
    while len(answered) < n and time.monotonic() < end:
        for i, s in enumerate(socks):
            if i in answered:
                continue
            try:
                if s.recv(4096):
                    answered.add(i)
            except BlockingIOError:
                pass
            except OSError:
                answered.add(i)  # closed: not idle any more, but answered
        time.sleep(0.05)
    return socks, len(answered)


def health_latency(port: int, timeout: float = 30.0) -> float | None:
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            if not s.recv(4096):
                return None
    except OSError:
        return None
    return time.monotonic() - t0


async def streams(base: str, model: str, n_streams: int, output_len: int, timeout: float) -> dict:
    limits = httpx.Limits(max_connections=n_streams + 4, max_keepalive_connections=n_streams + 4)
    args = argparse.Namespace(prompt_words=8, output_len=output_len)
    url = base + "/v1/chat/completions"
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout, connect=timeout)) as client:
        sem = asyncio.Semaphore(n_streams)

        async def one(i: int):
            body, _ = bench_serve.build_body(args, model, i, None)
            async with sem:
                return await bench_serve.send_request(client, url, {"Content-Type": "application/json"},
                                                      body, i, 0, timeout)

        results = await asyncio.gather(*(one(i) for i in range(2 * n_streams)))
    s = bench_serve.summarize(n_streams, list(results), output_len)
    return {k: s[k] for k in ("completed", "failed", "duration_s", "output_throughput", "ttft_ms", "itl_ms",
                              "failures")}


def wrk(url: str, connections: int, seconds: int, lua: str | None) -> float | None:
    cmd = ["wrk", "-t", "2", "-c", str(connections), "-d", f"{seconds}s", "--timeout", "10s"]
    if lua:
        cmd += ["-s", lua]
    out = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=seconds + 60).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        print(f"    wrk: {errors.group(1)} non-2xx answers", file=sys.stderr)
    return float(m.group(1)) if m else None


def run_build(name: str, vlm: str, args, workdir: Path) -> dict:
    log = workdir / f"{name}.log"
    model = ["-m", args.model] if args.model else []
    pin = ["taskset", "-c", args.server_cpus] if args.server_cpus else []
    proc = subprocess.Popen([*pin, vlm, "serve", *model, "--port", "0", "-t", str(args.threads),
                             "--max-num-seqs", str(args.streams), *args.serve_args.split()],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        port = None
        end = time.monotonic() + 120
        while port is None and time.monotonic() < end:
            m = re.search(r"serving on http://[^\s:]+:(\d+)", log.read_text(errors="replace"))
            port = int(m.group(1)) if m else None
            time.sleep(0.05)
        while health_latency(port, 2) is None or not _healthy(port):
            if time.monotonic() > end or proc.poll() is not None:
                raise SystemExit(f"{name}: the server did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"
        model_name = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        out: dict = {"rss_idle_mib": rss_mib(proc.pid), "pairs": []}
        asyncio.run(streams(base, model_name, 4, args.output_len, args.timeout))  # warm-up
        for _ in range(args.pairs):
            pair = {"alone": asyncio.run(streams(base, model_name, args.streams, args.output_len, args.timeout))}
            pair["rss_after_streams_mib"] = rss_mib(proc.pid)
            t0 = time.monotonic()
            socks, answered = open_idle(port, args.idle, args.timeout)
            pair["idle_open_s"] = time.monotonic() - t0
            pair["idle_answered"] = answered
            pair["health_with_idle_s"] = health_latency(port, args.timeout)
            pair["with_idle"] = asyncio.run(streams(base, model_name, args.streams, args.output_len,
                                                    args.timeout))
            pair["rss_with_idle_mib"] = rss_mib(proc.pid)
            for s in socks:
                s.close()
            time.sleep(1)
            out["pairs"].append(pair)
            if pair["with_idle"]["completed"] == 0:
                break  # this build cannot serve with the idle connections open: once is enough
        out["wrk_health_rps"] = wrk(base + "/health", args.wrk_connections, args.wrk_seconds, None)
        lua = workdir / "post.lua"
        lua.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                       f'wrk.body = {json.dumps(json.dumps({"model": model_name, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}))}\n')
        out["wrk_completion_rps"] = wrk(base + "/v1/chat/completions", args.wrk_connections, args.wrk_seconds,
                                        str(lua))
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def med(values):
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def fmt(v, digits=1):
    return "—" if v is None else f"{v:.{digits}f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", required=True, help="NAME=PATH_TO_VLM (repeatable)")
    ap.add_argument("--model", help="checkpoint directory (default: vlm's shipped tiny model)")
    ap.add_argument("--threads", type=int, default=1, help="-t for vlm serve (default 1)")
    ap.add_argument("--serve-args", default="", help="more vlm serve flags")
    ap.add_argument("--server-cpus", default="0",
                    help="taskset CPU list for the server (default 0; '' for none); run this script "
                         "itself on the others (e.g. taskset -c 1 python ...), so that the client's "
                         "work does not land in the server's latencies")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=3, help="alone / with-idle pairs per round")
    ap.add_argument("--wrk-connections", type=int, default=64)
    ap.add_argument("--wrk-seconds", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=120.0, help="deadline of each phase, seconds")
    ap.add_argument("--out-json", default="bench_front_door.json")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    builds = [b.split("=", 1) for b in args.build]
    runs: dict[str, list[dict]] = {name: [] for name, _ in builds}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, vlm in (builds if r % 2 == 0 else builds[::-1]):
                print(f"round {r + 1}: {name}", file=sys.stderr)
                runs[name].append(run_build(name, vlm, args, Path(tmp)))
    rows = []
    for name, rounds in runs.items():
        rs = [p for r in rounds for p in r["pairs"]]
        def m(path):
            vals = []
            for x in rs:
                for key in path:
                    x = x.get(key) if isinstance(x, dict) else None
                vals.append(x)
            return med(vals)
        alone50, alone99 = m(["alone", "itl_ms", "p50"]), m(["alone", "itl_ms", "p99"])
        idle50, idle99 = m(["with_idle", "itl_ms", "p50"]), m(["with_idle", "itl_ms", "p99"])
        rows.append((name, alone50, alone99, idle50, idle99,
                     None if not (alone50 and idle50) else idle50 / alone50,
                     None if not (alone99 and idle99) else idle99 / alone99,
                     m(["with_idle", "failed"]), m(["idle_answered"]), m(["health_with_idle_s"]),
                     m(["rss_after_streams_mib"]), m(["rss_with_idle_mib"]),
                     med([r["wrk_health_rps"] for r in rounds]),
                     med([r["wrk_completion_rps"] for r in rounds])))
    print(f"\n{args.streams} streams x {args.output_len} tokens; {args.idle} idle keep-alive connections; "
          f"medians over {args.rounds} rounds x {args.pairs} pairs\n")
    print("| build | ITL p50 / p99 alone (ms) | ITL p50 / p99 with idle (ms) | ratio p50 / p99 | "
          "failed with idle | idle answered | /health with idle (s) | RSS (MiB) alone / with idle | "
          "wrk /health req/s | wrk completion req/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (name, a50, a99, i50, i99, r50, r99, failed, answered, health, rss_a, rss_i, wh, wc) in rows:
        print(f"| {name} | {fmt(a50, 2)} / {fmt(a99, 2)} | {fmt(i50, 2)} / {fmt(i99, 2)} | "
              f"{fmt(r50, 2)} / {fmt(r99, 2)} | {fmt(failed, 0)} | {fmt(answered, 0)} / {args.idle} | "
              f"{fmt(health, 3)} | {fmt(rss_a, 0)} / {fmt(rss_i, 0)} | {fmt(wh, 0)} | {fmt(wc, 0)} |")
    Path(args.out_json).write_text(json.dumps({
        "command": [sys.executable] + sys.argv,
        "date": _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "config": vars(args), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
