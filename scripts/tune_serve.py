#!/usr/bin/env python3
"""Serving tuner for `vlm serve`: the sweet spot of batch size, token budget and KV memory for a
workload under a latency objective, found by starting and measuring servers.

A trial is one server setting (its `--max-num-seqs` N and the other searched flags) measured at
its own full load: N requests in flight (the workload of scripts/bench_serve.py, the first N
starts spread over one request's time, so the trial measures steady serving rather than a burst
of N arrivals). A trial meets the objective when no request failed and every given p99 bound
holds (`--slo-ttft`, `--slo-itl`, `--slo-e2e`, milliseconds). At N in flight the server runs all
of them in one batch, so N is both the batch size and the load: larger N gives more throughput
and longer latency, and the search looks for the largest N that still meets the objective.

The search (the Search class; `--duration` caps it, ten minutes by default):
 1. max-num-seqs: from --seqs-start, doubling while trials meet the objective (halving while
    they do not), then bisecting between the largest N that meets it and the smallest that does
    not, down to one sequence: about 2 log2(N) trials. Among the trials that met the objective,
    the one with the highest output throughput wins, except that a smaller N within
    --tolerance (3%) of it is preferred (the same throughput with less latency and memory).
 2. Each further dimension given more than one value (--max-batched-tokens, --max-encoder-ms,
    --kv-cache-dtype, --kv-cache-memory), in that order, one at a time: every other value is
    tried with the best setting so far, its N searched again from the best N. A value whose
    first trial misses the objective with less throughput than the best is dropped at once
    (at smaller N it could only do worse). A value wins with higher throughput; within
    --tolerance, the one with less KV memory reserved wins, else the one already found.

The answer is printed as a `vlm serve` command line and written as a `vlm serve --config` YAML
file; every trial (its setting, status, throughput, p99 latencies, the server's peak resident
memory during the trial and its KV cache bytes: reserved, and in use at the peak) goes to a
markdown table on stdout, a JSON file and a plot. A trial whose server does not start, whose
requests fail or that runs past --trial-timeout is recorded as such and counts as missing the
objective; the search stops when the --duration cap is reached and reports the best so far.

Dependencies: scripts/requirements-bench.txt (httpx, numpy; matplotlib for the plot).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import math
import re
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

try:
    import bench_serve as bs
except ImportError as e:  # httpx or numpy missing
    sys.exit(f"tune_serve: {e}: this Python needs the packages of requirements-bench.txt (beside "
             f"this script): python3 -m venv VENV && VENV/bin/pip install -r "
             f"{Path(__file__).resolve().parent / 'requirements-bench.txt'}; then VLM_PYTHON=VENV/bin/python "
             f"for `vlm tune`")

# The searched flags, in the order the search visits them after max-num-seqs.
DIMENSIONS = ("max-batched-tokens", "max-encoder-ms", "kv-cache-dtype", "kv-cache-memory")
SHORT_OPTIONS = {"-t": "threads", "-c": "ctx", "-q": "quiet", "-m": "model"}
METRICS = (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E"))


# --------------------------------------------------------------------------- the search


@dataclass
class Trial:
    """One measurement: a setting at its load. `meets` is false for anything but a clean run
    within the objective; `status` says which (meets, misses, failed, timeout, server failed,
    time cap)."""
    setting: dict[str, Any]
    load: int
    status: str
    throughput: float = 0.0  # output tokens per second
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def meets(self) -> bool:
        return self.status == "meets"

    @property
    def kv_bytes(self) -> float:
        return self.figures.get("kv_reserved_bytes") or 0.0


class TimeCap(Exception):
    """The search's time is spent; `trial`: the one it cut short, if any."""

    def __init__(self, trial: "Trial | None" = None):
        super().__init__("the time is spent")
        self.trial = trial


class Search:
    """The search over server settings. `measure(setting, n) -> Trial` runs one trial (and
    raises TimeCap when the time is spent); the search never measures one (setting, n) twice."""

    def __init__(self, measure: Callable[[dict, int], Trial], space: dict[str, list],
                 seqs_min: int, seqs_max: int, seqs_start: int, tolerance: float):
        self.measure = measure
        self.space = space
        self.seqs_min, self.seqs_max = seqs_min, seqs_max
        self.seqs_start = min(max(seqs_start, seqs_min), seqs_max)
        self.tolerance = tolerance
        self.trials: list[Trial] = []
        self.capped = False
        self._seen: dict[tuple, Trial] = {}

    def trial(self, setting: dict, n: int) -> Trial:
        key = (tuple(sorted(setting.items())), n)
        if key not in self._seen:
            try:
                t = self.measure(dict(setting), n)
            except TimeCap as cap:
                if cap.trial is not None:
                    self.trials.append(cap.trial)
                raise
            self._seen[key] = t
            self.trials.append(t)
        return self._seen[key]

    def within(self, a: float, b: float) -> bool:
        """a is at least (1 - tolerance) of b."""
        return a >= (1.0 - self.tolerance) * b

    def edge(self, setting: dict, start: int, rival: Trial | None = None) -> Trial | None:
        """The best trial of `setting` meeting the objective (None: none does), with N searched
        from `start`: doubling up while trials meet the objective, halving down while they do
        not, then bisecting between the largest N that meets it and the smallest that does not.
        With `rival`, a setting whose first trial misses with less throughput stops there."""
        good, bad = None, None
        n = start
        while True:
            t = self.trial(setting, n)
            if t.meets:
                good = n
            else:
                bad = n
                if rival is not None and good is None and n == start and \
                        t.throughput < rival.throughput:
                    break
            if bad is None:
                if n >= self.seqs_max:
                    break
                n = min(self.seqs_max, 2 * n)
            elif good is None:
                if n <= self.seqs_min:
                    break
                n = max(self.seqs_min, n // 2)
            else:
                if bad - good <= 1:
                    break
                n = (good + bad) // 2
        return self.pick([t for t in self.trials if t.meets and t.setting == setting])

    def pick(self, met: list[Trial]) -> Trial | None:
        """The smallest N within the tolerance of the best throughput among `met`."""
        if not met:
            return None
        top = max(t.throughput for t in met)
        return min((t for t in met if self.within(t.throughput, top)), key=lambda t: t.load)

    def better(self, cand: Trial, best: Trial) -> bool:
        if not self.within(cand.throughput, best.throughput):
            return False  # clearly less throughput
        if not self.within(best.throughput, cand.throughput):
            return True  # clearly more
        return cand.kv_bytes < best.kv_bytes  # a tie: the less KV memory

    def run(self) -> Trial | None:
        base = {d: vals[0] for d, vals in self.space.items()}
        best = None
        try:
            best = self.edge(base, self.seqs_start)
            if best is None:
                return None
            for dim in DIMENSIONS:
                for v in self.space.get(dim, []):
                    if v == best.setting[dim]:
                        continue
                    cand = self.edge({**best.setting, dim: v}, best.load, rival=best)
                    if cand is not None and self.better(cand, best):
                        best = cand
        except TimeCap:
            self.capped = True
            if best is None:  # cut short in the first setting's search
                best = self.pick([t for t in self.trials if t.meets])
        return best


# --------------------------------------------------------------------------- the objective


@dataclass
class Objective:
    ttft: float | None = None  # ms, at the percentile
    itl: float | None = None
    e2e: float | None = None
    percentile: int = 99

    def misses(self, summary: dict) -> list[str]:
        """The bounds a level's summary breaks, in words."""
        out = []
        for key, name in METRICS:
            bound = getattr(self, key)
            if bound is None:
                continue
            got = summary[f"{key}_ms"].get(f"p{self.percentile}")
            if got is None:
                out.append(f"no {name} measured")
            elif got > bound:
                out.append(f"{name} p{self.percentile} {got:,.0f} > {bound:,.0f} ms")
        return out

    def describe(self) -> str:
        parts = [f"{name} p{self.percentile} <= {getattr(self, key):,.0f} ms"
                 for key, name in METRICS if getattr(self, key) is not None]
        return ", ".join(parts)


# --------------------------------------------------------------------------- the servers


def setting_flags(setting: dict, n: int) -> list[str]:
    """The `vlm serve` flags of a setting ("auto": the server's default, no flag)."""
    flags = ["--max-num-seqs", str(n)]
    for dim in DIMENSIONS:
        v = setting.get(dim, "auto")
        if v != "auto":
            flags += [f"--{dim}", str(v)]
    return flags


def proc_rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class TrialRunner:
    """Runs trials on servers it starts: one server at a time, restarted when the flags change."""

    def __init__(self, args: argparse.Namespace, objective: Objective, deadline: float):
        self.args = args
        self.objective = objective
        self.deadline = deadline
        self.server: bs.ServerProcess | None = None
        self.flags: list[str] | None = None
        self.base = ""
        self.model = ""
        self.stagger = 0.0  # seconds between a trial's first starts: a warm-up request's time
        self.next_index = 0
        self.images = None
        if not args.no_image:
            self.images = bs.ImageMaker(bs.load_photos(Path(args.images_dir)), args.size,
                                        args.seed, args.jpeg_quality)
        self.log_dir = Path(args.server_log_dir or tempfile.mkdtemp(prefix="vlm-tune-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.done: list[Trial] = []

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server, self.flags = None, None

    def __call__(self, setting: dict, n: int) -> Trial:
        if self.remaining() <= 0:
            raise TimeCap()
        flags = setting_flags(setting, n)
        t0 = time.monotonic()
        trial = asyncio.run(self._trial(setting, n, flags))
        trial.figures["trial_s"] = time.monotonic() - t0
        trial.figures["at_s"] = time.monotonic() - self.started
        self._log(trial)
        if trial.status == "time cap":
            self.stop()
            raise TimeCap(trial)
        return trial

    def _log(self, t: Trial) -> None:
        f = t.figures
        desc = " ".join(setting_flags(t.setting, t.load))
        extra = f" ({t.reason})" if t.reason else ""
        bs.log(self.args, f"tune: trial {len(self.done) + 1}: {desc}: {t.status}{extra}, "
                          f"{t.throughput:.2f} out tok/s, {f.get('trial_s', 0):.0f} s")
        self.done.append(t)

    async def _start(self, flags: list[str], client) -> str | None:
        """Starts the server for `flags` (stopping the last one); an error in words, or None."""
        self.stop()
        serve_args = (self.args.serve_args + " " + shlex.join(flags)).strip()
        log_path = self.log_dir / f"server-{len(list(self.log_dir.glob('server-*.log'))) + 1}.log"
        self.server = bs.ServerProcess(self.args.vlm, self.args.model, serve_args, str(log_path))
        self.flags = flags
        timeout = min(self.args.startup_timeout, max(self.remaining(), 0.0))
        try:
            loop = asyncio.get_running_loop()
            self.base = await loop.run_in_executor(None, self.server.wait_url, timeout)
            await bs.wait_health(client, self.base, timeout, self.server)
        except SystemExit as e:
            tail = self.server.tail(5).strip().replace("\n", " | ")
            self.stop()
            if self.remaining() <= 0:
                return "time cap"
            first = str(e).splitlines()[0].removeprefix("bench_serve: ")
            return f"{first}: {tail}"
        model = self.args.model_name
        if model is None:
            try:
                r = await client.get(self.base + "/v1/models", timeout=10.0)
                model = r.json()["data"][0]["id"]
            except (bs.httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
                model = "default"
        self.model = model
        # Warm-up requests, one at a time; the last one's time spaces the trials' first starts.
        for _ in range(max(0, self.args.warmup)):
            body, nbytes = bs.build_body(self.args, model, self.next_index, self.images)
            res = await bs.send_request(client, self.base + "/v1/chat/completions", {}, body,
                                        self.next_index, nbytes, self.args.timeout)
            self.next_index += 1
            if not res.ok:
                return f"warm-up request failed: {res.error}"
            self.stagger = res.e2e
        return None

    async def _trial(self, setting: dict, n: int, flags: list[str]) -> Trial:
        a = self.args
        headers = {"Content-Type": "application/json"}
        if a.api_key:
            headers["Authorization"] = f"Bearer {a.api_key}"
        limits = bs.httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4,
                                 keepalive_expiry=4.0)
        async with bs.httpx.AsyncClient(limits=limits, timeout=bs.httpx.Timeout(
                a.timeout, connect=30.0), headers=headers) as client, \
                bs.httpx.AsyncClient(timeout=30.0, headers=headers) as side:
            if self.flags != flags or self.server is None or self.server.proc.poll() is not None:
                err = await self._start(flags, side)
                if err == "time cap":
                    return Trial(setting, n, "time cap", reason="the server was still starting")
                if err:
                    return Trial(setting, n, "server failed", reason=err)
            count = a.requests_per_trial or max(a.min_requests, a.waves * n)
            rss = []

            async def watch_rss() -> None:
                while True:
                    v = proc_rss_bytes(self.server.proc.pid)
                    if v is not None:
                        rss.append(v)
                    await asyncio.sleep(0.25)

            watcher = asyncio.create_task(watch_rss())
            budget = min(a.trial_timeout, self.remaining())
            level = bs.run_level(a, client, side, self.base, self.model, self.images, n, count,
                                 self.next_index, stagger_s=self.stagger / max(n, 1))
            self.next_index += count
            try:
                summary, _ = await asyncio.wait_for(level, max(budget, 0.001))
            except asyncio.TimeoutError:
                capped = budget < a.trial_timeout
                self.stop()  # its requests were cut off: a fresh server for the next trial
                return Trial(setting, n, "time cap" if capped else "timeout",
                             reason=f"not done in {budget:.0f} s")
            finally:
                watcher.cancel()
        return self._judge(setting, n, summary, max(rss) if rss else None)

    def _judge(self, setting: dict, n: int, summary: dict, rss: int | None) -> Trial:
        gauges = summary["server_metrics"].get("gauges_after", {})
        kv_bytes = gauges.get("vlm_kv_cache_memory_bytes")
        blocks = gauges.get("vlm_kv_cache_blocks_capacity")
        peak_blocks = summary["server"]["peaks"].get("vlm_kv_cache_blocks_used")
        figures = {
            "requests": summary["num_requests"],
            "failed": summary["failed"],
            "request_throughput": summary["request_throughput"],
            "peak_running": summary["server"]["peaks"].get("vlm_num_requests_running"),
            "rss_peak_bytes": rss,
            "kv_reserved_bytes": kv_bytes,
            "kv_peak_used_bytes": (kv_bytes * peak_blocks / blocks
                                   if kv_bytes and blocks and peak_blocks is not None else None),
            "preemptions": summary["server"].get("preemptions"),
        }
        for key, _ in METRICS:
            figures[f"{key}_ms"] = summary[f"{key}_ms"]
        t = Trial(setting, n, "meets", summary["output_throughput"], figures=figures)
        if summary["failed"]:
            t.status = "failed"
            t.reason = f"{summary['failed']} of {summary['num_requests']} requests failed: " \
                       f"{summary['failures'][0]}"
        else:
            misses = self.objective.misses(summary)
            if misses:
                t.status, t.reason = "misses", "; ".join(misses)
        return t


# --------------------------------------------------------------------------- the answer


def serve_args_mapping(serve_args: str) -> dict[str, Any]:
    """`vlm serve` flags as --config keys: --name value, --name=value, --flag (true), the short
    options by their long names; a repeated option becomes a list."""
    out: dict[str, Any] = {}
    toks = shlex.split(serve_args)
    i = 0
    number = re.compile(r"-?\d+(\.\d+)?$")
    while i < len(toks):
        tok = toks[i]
        if tok.startswith("--"):
            name, sep, value = tok[2:].partition("=")
        elif tok in SHORT_OPTIONS:
            name, sep, value = SHORT_OPTIONS[tok], "", ""
        else:
            raise SystemExit(f"tune_serve: --serve-args: cannot read {tok!r} (long options, "
                             f"or {', '.join(SHORT_OPTIONS)})")
        if not sep:
            nxt = toks[i + 1] if i + 1 < len(toks) else None
            if nxt is not None and (not nxt.startswith("-") or number.match(nxt)):
                value = nxt
                i += 1
            else:
                value = True
        if name in out:
            prev = out[name]
            out[name] = (prev if isinstance(prev, list) else [prev]) + [value]
        else:
            out[name] = value
        i += 1
    return out


def yaml_scalar(v: Any) -> str:
    if v is True:
        return "true"
    s = str(v)
    return s if re.fullmatch(r"[A-Za-z0-9_./:@+-]+", s) and s.lower() not in (
        "true", "false", "yes", "no", "null", "on", "off") else json.dumps(s)


def config_yaml(args: argparse.Namespace, best: Trial, header: list[str]) -> str:
    """The recommendation as a `vlm serve --config` file."""
    keys = serve_args_mapping(args.serve_args)
    keys.pop("port", None)
    tuned = serve_args_mapping(shlex.join(setting_flags(best.setting, best.load)))
    lines = [f"# {h}" for h in header]
    lines.append(f"model: {yaml_scalar(args.model)}")
    for name, v in {**keys, **tuned}.items():
        if isinstance(v, list):
            lines.append(f"{name}: [{', '.join(yaml_scalar(x) for x in v)}]")
        else:
            lines.append(f"{name}: {yaml_scalar(v)}")
    return "\n".join(lines) + "\n"


def serve_command(args: argparse.Namespace, best: Trial) -> str:
    cmd = ["vlm", "serve", "-m", args.model] + shlex.split(args.serve_args)
    return shlex.join(cmd + setting_flags(best.setting, best.load))


def _mib(v: float | None) -> str:
    return "–" if v is None else f"{v / 2**20:,.0f}"


def _ms(t: Trial, key: str, pct: int) -> str:
    s = t.figures.get(f"{key}_ms") or {}
    return bs._fmt(s.get(f"p{pct}"))


def trials_table(trials: list[Trial], searched: list[str], pct: int) -> str:
    head = ["#", "max-num-seqs"] + searched + [
        "status", "out tok/s", "req/s", f"TTFT p{pct} ms", f"ITL p{pct} ms", f"E2E p{pct} ms",
        "peak RSS MiB", "KV reserved / peak used MiB", "trial s"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, t in enumerate(trials, 1):
        f = t.figures
        status = t.status + (f": {t.reason}" if t.reason and t.status != "meets" else "")
        row = [str(i), str(t.load)] + [str(t.setting.get(d, "auto")) for d in searched] + [
            status, f"{t.throughput:.2f}",
            "–" if "request_throughput" not in f else f"{f['request_throughput']:.3f}",
            _ms(t, "ttft", pct), _ms(t, "itl", pct), _ms(t, "e2e", pct),
            _mib(f.get("rss_peak_bytes")),
            f"{_mib(f.get('kv_reserved_bytes'))} / {_mib(f.get('kv_peak_used_bytes'))}",
            f"{f.get('trial_s', 0):.0f}"]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def plot(trials: list[Trial], objective: Objective, best: Trial | None, path: str,
         title: str) -> None:
    """Throughput and the objective's latencies against max-num-seqs, and throughput against
    the server's peak resident memory."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [t for t in trials if "request_throughput" in t.figures]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    ax_tp, ax_lat, ax_mem = axes
    for t in measured:
        color = "tab:green" if t.meets else "tab:red"
        ax_tp.scatter(t.load, t.throughput, color=color, marker="o" if t.meets else "x")
        rss = t.figures.get("rss_peak_bytes")
        if rss:
            ax_mem.scatter(rss / 2**20, t.throughput, color=color, marker="o" if t.meets else "x")
    if best is not None:
        ax_tp.scatter(best.load, best.throughput, s=160, facecolors="none", edgecolors="black",
                      label="recommended")
        ax_tp.legend(fontsize=7)
    pct = objective.percentile
    for (key, name), color in zip(METRICS, ("tab:blue", "tab:orange", "tab:purple")):
        pts = sorted((t.load, t.figures[f"{key}_ms"].get(f"p{pct}")) for t in measured
                     if t.figures[f"{key}_ms"].get(f"p{pct}") is not None)
        if not pts:
            continue
        ax_lat.plot([p[0] for p in pts], [p[1] for p in pts], "o", color=color,
                    label=f"{name} p{pct}")
        bound = getattr(objective, key)
        if bound is not None:
            ax_lat.axhline(bound, color=color, linestyle="--", linewidth=1,
                           label=f"{name} objective")
    ax_tp.set(xlabel="max-num-seqs (= requests in flight)", ylabel="output tok/s",
              title="throughput (o meets, x misses)")
    ax_lat.set(xlabel="max-num-seqs (= requests in flight)", ylabel="ms",
               title="latency at the percentile")
    ax_lat.set_yscale("log")
    ax_lat.legend(fontsize=7)
    ax_mem.set(xlabel="server peak RSS during the trial (MiB)", ylabel="output tok/s",
               title="throughput against memory")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def value_list(text: str, kind: Callable[[str], Any], what: str,
               p: argparse.ArgumentParser) -> list:
    out = []
    for x in text.split(","):
        x = x.strip()
        if not x:
            continue
        if x == "auto":
            out.append("auto")
            continue
        try:
            out.append(kind(x))
        except ValueError:
            p.error(f"--{what}: {x!r} is not a value it takes")
    if not out or len(set(map(str, out))) != len(out):
        p.error(f"--{what}: a comma-separated list of distinct values")
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Find the `vlm serve` setting with the highest throughput under a latency "
        "objective (see the module doc).", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    bs.add_server_args(p)
    p.add_argument("--server-log-dir", help="where each started server's log goes "
                   "(server-1.log, ...); a temporary folder if unset")
    bs.add_workload_args(p)
    o = p.add_argument_group("objective (milliseconds, at --slo-percentile; at least one)")
    o.add_argument("--slo-ttft", type=float, help="time to first token")
    o.add_argument("--slo-itl", type=float, help="inter-token latency")
    o.add_argument("--slo-e2e", type=float, help="whole request")
    o.add_argument("--slo-percentile", type=int, default=99)
    s = p.add_argument_group("search")
    s.add_argument("--seqs-min", type=int, default=1, help="smallest --max-num-seqs")
    s.add_argument("--seqs-max", type=int, default=64, help="largest --max-num-seqs")
    s.add_argument("--seqs-start", type=int, default=1, help="the first --max-num-seqs tried")
    s.add_argument("--max-batched-tokens", default="auto",
                   help="values to try, comma-separated (auto: the server's default)")
    s.add_argument("--max-encoder-ms", default="auto", help="values to try (-1: whole encodes)")
    s.add_argument("--kv-cache-dtype", default="auto", help="values to try (auto,bf16,int8,f32)")
    s.add_argument("--kv-cache-memory", default="auto", help="values to try, in bytes")
    s.add_argument("--tolerance", type=float, default=0.03,
                   help="throughputs this close count as equal (the smaller N, or less KV "
                   "memory, wins)")
    s.add_argument("--duration", type=float, default=600.0,
                   help="seconds for the whole search, server starts included")
    s.add_argument("--trial-timeout", type=float, default=300.0,
                   help="seconds one trial may take (then it counts as missing)")
    s.add_argument("--waves", type=int, default=3,
                   help="requests per trial: this many times N (at least --min-requests)")
    s.add_argument("--min-requests", type=int, default=8)
    s.add_argument("--requests-per-trial", type=int, default=0, help="fixed count (0: --waves)")
    out = p.add_argument_group("output")
    out.add_argument("--out-json", default="tune_serve.json", help="'' to skip")
    out.add_argument("--out-png", default="tune_serve.png", help="'' to skip")
    out.add_argument("--out-config", default="tuned.yaml",
                     help="the recommendation as a `vlm serve --config` file ('' to skip)")
    out.add_argument("--quiet", action="store_true", help="no per-trial progress on stderr")
    args = p.parse_args(argv)
    if not args.vlm or not args.model:
        p.error("the tuner starts its own servers: give --vlm and --model")
    bs.check_workload_args(p, args)
    if args.workload != "single":
        p.error("the tuner measures single requests (--workload single, or --request-file)")
    if args.slo_ttft is None and args.slo_itl is None and args.slo_e2e is None:
        p.error("give an objective: --slo-ttft, --slo-itl and/or --slo-e2e (milliseconds)")
    for name in ("slo_ttft", "slo_itl", "slo_e2e"):
        v = getattr(args, name)
        if v is not None and not (v > 0 and math.isfinite(v)):
            p.error(f"--{name.replace('_', '-')} must be a positive number of milliseconds")
    if not 0 < args.slo_percentile <= 100:
        p.error("--slo-percentile must be in (0, 100]")
    if not 1 <= args.seqs_min <= args.seqs_max:
        p.error("--seqs-min and --seqs-max: 1 <= min <= max")
    if not 0 <= args.tolerance < 1:
        p.error("--tolerance must be in [0, 1)")
    if args.duration <= 0 or args.trial_timeout <= 0:
        p.error("--duration and --trial-timeout must be positive")
    if args.waves < 1 or args.min_requests < 1 or args.requests_per_trial < 0:
        p.error("--waves and --min-requests must be >= 1, --requests-per-trial >= 0")
    taken = serve_args_mapping(args.serve_args)
    for dim in ("max-num-seqs", "port") + DIMENSIONS:
        if dim in taken and dim != "port":
            p.error(f"--serve-args sets --{dim}, which the tuner searches: give its values to "
                    f"the tuner's --{dim} instead")
    args.space = {
        "max-batched-tokens": value_list(args.max_batched_tokens, int, "max-batched-tokens", p),
        "max-encoder-ms": value_list(args.max_encoder_ms, int, "max-encoder-ms", p),
        "kv-cache-dtype": value_list(args.kv_cache_dtype, str, "kv-cache-dtype", p),
        "kv-cache-memory": value_list(args.kv_cache_memory, int, "kv-cache-memory", p),
    }
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    objective = Objective(args.slo_ttft, args.slo_itl, args.slo_e2e, args.slo_percentile)
    runner = TrialRunner(args, objective, time.monotonic() + args.duration)
    bs.log(args, f"tune: {bs.workload_title(args)}; objective {objective.describe()}; "
                 f"at most {args.duration:g} s; server logs in {runner.log_dir}")
    search = Search(runner, args.space, args.seqs_min, args.seqs_max, args.seqs_start,
                    args.tolerance)
    try:
        best = search.run()
    except KeyboardInterrupt:
        runner.stop()
        return 130
    finally:
        runner.stop()
    return report(args, objective, search, best)


def report(args: argparse.Namespace, objective: Objective, search: Search,
           best: Trial | None) -> int:
    searched = [d for d in DIMENSIONS if len(args.space[d]) > 1 or args.space[d][0] != "auto"]
    pct = objective.percentile
    print(trials_table(search.trials, searched, pct))
    date = _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")
    header = [f"vlm serve --config: written by scripts/tune_serve.py on {date}",
              f"workload: {bs.workload_title(args)}",
              f"objective: {objective.describe()}"]
    capped = " (the --duration cap ended the search: the best found so far)" \
        if search.capped else ""
    if best is None:
        print(f"\nNo setting met the objective ({objective.describe()}){capped}: even "
              f"--max-num-seqs {args.seqs_min} misses it on this workload (see the table).")
    else:
        f = best.figures
        lat = ", ".join(f"{name} p{pct} {_ms(best, key, pct)} ms" for key, name in METRICS)
        measured = (f"measured: {best.throughput:.2f} output tok/s, "
                    f"{f['request_throughput']:.3f} req/s at {best.load} in flight; {lat}; "
                    f"peak RSS {_mib(f.get('rss_peak_bytes'))} MiB, KV reserved "
                    f"{_mib(f.get('kv_reserved_bytes'))} MiB")
        header.append(measured)
        print(f"\nRecommended{capped}: {measured}\n\n    {serve_command(args, best)}\n")
        if args.out_config:
            Path(args.out_config).write_text(config_yaml(args, best, header))
            print(f"or: vlm serve --config {args.out_config}")
    doc = {
        "command_line": shlex.join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "date": date,
        "repo_commit": bs.git_commit(),
        "workload": bs.workload_title(args),
        "objective": {"ttft_ms": objective.ttft, "itl_ms": objective.itl,
                      "e2e_ms": objective.e2e, "percentile": pct},
        "capped": search.capped,
        "recommended": None if best is None else {
            "serve_command": serve_command(args, best), "setting": best.setting,
            "max_num_seqs": best.load, "throughput": best.throughput, "figures": best.figures},
        "trials": [{"setting": t.setting, "max_num_seqs": t.load, "status": t.status,
                    "reason": t.reason, "throughput": t.throughput, "figures": t.figures}
                   for t in search.trials],
    }
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(doc, indent=1))
        bs.log(args, f"wrote {args.out_json}")
    if args.out_png and search.trials:
        try:
            plot(search.trials, objective, best, args.out_png,
                 f"vlm tune — {bs.workload_title(args)} — {objective.describe()}")
            bs.log(args, f"wrote {args.out_png}")
        except Exception as e:  # noqa: BLE001 - the table and JSON are already out
            print(f"tune_serve: could not draw {args.out_png}: {type(e).__name__}: {e}",
                  file=sys.stderr)
            return 1
    return 0 if best is not None else 2


if __name__ == "__main__":
    sys.exit(main())
