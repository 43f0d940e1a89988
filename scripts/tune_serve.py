#!/usr/bin/env python3
"""Serving tuner for `vlm serve` (what `vlm tune` runs): the sweet spot of batch size, token
budget and KV memory for a workload under a latency objective, found by starting servers and
measuring them.

A trial is one server setting (its `--max-num-seqs` N and the other searched flags) on a fresh
server, measured at its own full load: after a warm-up request, N requests in flight (the
workload of scripts/bench_serve.py; every trial sends the same requests; the first N starts are
spread over the warm-up's time, so the trial measures steady serving rather than a burst of N
arrivals). Its throughput is the output tokens per second while all N were in flight (from the
N-th start to the last start). It meets the objective when no request failed and every given
bound holds at the percentile (`--slo-ttft`, `--slo-itl`, `--slo-e2e`, milliseconds, p99 by
default). At N in flight the server runs all of them in one batch, so N is both the batch size
and the load: larger N gives more throughput and longer latency, and the search looks for the
largest N that still meets the objective.

The search (the Search class; `--duration` caps it, ten minutes by default):
 1. max-num-seqs: from --seqs-start, doubling while trials meet the objective (halving while
    they do not), then bisecting between the largest N that meets it and the smallest that does
    not, within --seqs-min and --seqs-max: about 2 log2(N) trials.
 2. Each further dimension given more than one value (--max-batched-tokens, --max-encoder-ms,
    --kv-cache-dtype, --kv-cache-memory), in that order, one at a time: every other value is
    tried with the best setting so far, its N searched again from the best N. A value whose
    first trial misses the objective with clearly less throughput than the best is dropped at
    once (at smaller N it could only do worse). When nothing meets the objective with the first
    values, each other value is tried first, from --seqs-min.
Of the trials that met the objective, the highest throughput wins; throughputs within
--tolerance (3%) of the highest count as equal, and of those the one with the least KV memory
reserved (with a hybrid model's linear-attention state), then the smallest N, wins (the same
throughput for less memory and latency).

The answer is printed as a `vlm serve` command line and written as a `vlm serve --config` YAML
file; every trial (its setting, status, throughput, p99 latencies, the server's peak resident
memory during the trial and its KV cache bytes: reserved, and in use at the peak) goes to a
markdown table on stdout, a JSON file and a plot. A trial whose server does not start, whose
requests fail or that runs past --trial-timeout is recorded as such and counts as missing the
objective; the search stops at the --duration cap (or Ctrl-C, or an unexpected error) and
reports the best so far. `--replot FILE.json --out-png F.png` draws an earlier run's plot again.

Dependencies: scripts/requirements-bench.txt (httpx, numpy; pillow for the generated images,
matplotlib for the plot).
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
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REQS = Path(__file__).resolve().parent / "requirements-bench.txt"
try:
    import bench_serve as bs
except ImportError as e:  # httpx or numpy missing
    sys.exit(f"tune_serve: {e}: this Python needs the packages of requirements-bench.txt (beside "
             f"this script): python3 -m venv VENV && VENV/bin/pip install -r {REQS}; then "
             f"VLM_PYTHON=VENV/bin/python for `vlm tune`")

# The searched flags, in the order the search visits them after max-num-seqs.
DIMENSIONS = ("max-batched-tokens", "max-encoder-ms", "kv-cache-dtype", "kv-cache-memory")
SHORT_OPTIONS = {"-t": "threads", "-c": "ctx", "-q": "quiet", "-m": "model"}
METRICS = (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E"))
CONFIG_HEADER = "vlm serve --config: written by scripts/tune_serve.py"


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
        """KV cache bytes reserved (unknown: never the smaller)."""
        v = self.figures.get("kv_reserved_bytes")
        return math.inf if v is None else v


class TimeCap(Exception):
    """The search's time is spent; `trial`: the one it cut short, if any."""

    def __init__(self, trial: "Trial | None" = None):
        super().__init__("the time is spent")
        self.trial = trial


class Search:
    """The search over server settings. `measure(setting, n) -> Trial` runs one trial (and
    raises TimeCap when the time is spent); the search never measures one (setting, n) twice.
    `stopped` says what ended it early: "" (nothing), "time cap", "interrupted" or "error: ..."."""

    def __init__(self, measure: Callable[[dict, int], Trial], space: dict[str, list],
                 seqs_min: int, seqs_max: int, seqs_start: int, tolerance: float):
        self.measure = measure
        self.space = space
        self.seqs_min, self.seqs_max = seqs_min, seqs_max
        self.seqs_start = min(max(seqs_start, seqs_min), seqs_max)
        self.tolerance = tolerance
        self.trials: list[Trial] = []
        self.stopped = ""
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

    def choose(self, met: list[Trial]) -> Trial | None:
        """Of trials that met the objective, those within the tolerance of the highest
        throughput count as equal; of them, the least KV memory, then the smallest N."""
        if not met:
            return None
        top = max(t.throughput for t in met)
        return min((t for t in met if self.within(t.throughput, top)),
                   key=lambda t: (t.kv_bytes, t.load))

    def edge(self, setting: dict, start: int, rival: Trial | None = None) -> Trial | None:
        """The best trial of `setting` meeting the objective (None: none does), with N searched
        from `start`: doubling up while trials meet the objective, halving down while they do
        not, then bisecting between the largest N that meets it and the smallest that does not.
        With `rival`, a setting whose first trial misses the objective (measured, not failed),
        short of the rival's throughput by more than the tolerance, stops there (at smaller N its
        throughput is lower still)."""
        good, bad = None, None
        n = start
        while True:
            t = self.trial(setting, n)
            if t.meets:
                good = n
            else:
                bad = n
                if rival is not None and good is None and n == start and \
                        t.status == "misses" and not self.within(t.throughput, rival.throughput):
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
        return self.choose([t for t in self.trials if t.meets and t.setting == setting])

    def best(self) -> Trial | None:
        return self.choose([t for t in self.trials if t.meets])

    def run(self) -> Trial | None:
        """The best trial of the search (None: none met the objective); `stopped` says whether it
        ended early."""
        base = {d: vals[0] for d, vals in self.space.items()}
        try:
            if self.edge(base, self.seqs_start) is None:
                # Nothing met it with the first values: each other value, from the smallest N.
                for dim in DIMENSIONS:
                    for v in self.space.get(dim, [])[1:]:
                        self.edge({**base, dim: v}, self.seqs_min)
            if self.best() is None:
                return None
            for dim in DIMENSIONS:
                for v in self.space.get(dim, []):
                    best = self.best()
                    if v != best.setting[dim]:
                        self.edge({**best.setting, dim: v}, best.load, rival=best)
        except TimeCap:
            self.stopped = "time cap"
        except KeyboardInterrupt:
            self.stopped = "interrupted"
        except Exception as e:  # noqa: BLE001 - the trials so far are still reported
            traceback.print_exc()
            self.stopped = f"error: {type(e).__name__}: {e}"
        return self.best()


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


def setting_keys(setting: dict, n: int) -> dict[str, Any]:
    """The `vlm serve` options of a setting at N, by long name ("auto": the server's default,
    left out)."""
    return {"max-num-seqs": n,
            **{d: setting[d] for d in DIMENSIONS if setting.get(d, "auto") != "auto"}}


def setting_flags(setting: dict, n: int) -> list[str]:
    """The same as `vlm serve` flags."""
    return [x for k, v in setting_keys(setting, n).items() for x in (f"--{k}", str(v))]


def proc_rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def steady_throughput(summary: dict, n: int) -> float | None:
    """Output tokens per second while all `n` requests were in flight: from the first moment `n`
    were (the spread first starts done) to the last start (after it, the drain), counting each
    request's content chunks in that window (each weighted by its completion_tokens / chunks).
    None when `n` were never in flight before the last start."""
    reqs = [r for r in summary["requests"] if r["ok"]]
    if not reqs:
        return None
    events = sorted([(r["start_s"], 1) for r in reqs] + [(r["start_s"] + r["e2e_s"], -1)
                                                         for r in reqs],
                    key=lambda e: (e[0], e[1]))  # an end before a start at the same time
    t1 = max(r["start_s"] for r in reqs)
    t0, running = None, 0
    for t, d in events:
        running += d
        if running >= n:
            t0 = t
            break
    if t0 is None or t1 - t0 <= 0:
        return None
    tokens = 0.0
    for r in reqs:
        chunks = [r["start_s"] + c for c in r["chunk_times_s"]]
        if chunks:
            per_chunk = (r["completion_tokens"] or len(chunks)) / len(chunks)
            tokens += per_chunk * sum(1 for c in chunks if t0 <= c < t1)
    return tokens / (t1 - t0)


class TrialRunner:
    """Runs trials on servers it starts, a fresh one for each trial (every trial has its own
    --max-num-seqs), all trials sending the same requests."""

    def __init__(self, args: argparse.Namespace, objective: Objective, deadline: float):
        self.args = args
        self.objective = objective
        self.deadline = deadline
        self.server: bs.ServerProcess | None = None
        self.log_path: Path | None = None
        self.base = ""
        self.model = ""
        self.bodies: list[tuple[int, bytes, int]] = []  # the workload, made once
        self.photos = None
        if not args.no_image:
            try:
                self.photos = bs.load_photos(Path(args.images_dir))
            except ImportError as e:
                sys.exit(f"tune_serve: {e}: generated images need Pillow ({REQS})")
        self.images = None  # made with the bodies, once the model's name is known (_start)
        self.log_dir = Path(args.server_log_dir or tempfile.mkdtemp(prefix="vlm-tune-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.done: list[Trial] = []
        self.warmup: tuple[bytes, int] | None = None
        self.trial_deadline = deadline
        self.said_repeats = False

    def make_images(self):
        if self.photos is None:
            return None
        a = self.args
        return bs.ImageMaker(self.photos, a.size, a.seed, a.jpeg_quality)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server = None

    def __call__(self, setting: dict, n: int) -> Trial:
        if self.remaining() <= 0:
            raise TimeCap()
        t0 = time.monotonic()
        try:
            trial = asyncio.run(self._trial(setting, n))
        finally:
            self.stop()
        trial.figures["trial_s"] = time.monotonic() - t0
        trial.figures["at_s"] = time.monotonic() - self.started
        trial.figures["server_log"] = str(self.log_path)
        self.done.append(trial)
        f = trial.figures
        extra = f" ({trial.reason})" if trial.reason else ""
        bs.log(self.args, f"tune: trial {len(self.done)}: "
                          f"{' '.join(setting_flags(setting, n))}: {trial.status}{extra}, "
                          f"{trial.throughput:.2f} out tok/s, {f['trial_s']:.0f} s")
        if trial.status == "time cap":
            raise TimeCap(trial)
        return trial

    def workload(self, count: int) -> list[tuple[int, bytes, int]]:
        """The first `count` requests (the same for every trial), and the warm-up's body."""
        while len(self.bodies) < count:
            i = len(self.bodies)
            self.bodies.append((i, *bs.build_body(self.args, self.model, i, self.images)))
        return self.bodies[:count]

    def warmup_body(self) -> tuple[bytes, int]:
        """The warm-up request, made once: an image of its own, or the file's last recorded
        request (a trial sends it only when it sends them all)."""
        if self.warmup is None:
            index = len(self.args.recorded) - 1 if self.args.recorded else -1
            self.warmup = bs.build_body(self.args, self.model, index, self.images)
        return self.warmup

    async def _start(self, flags: list[str], side) -> str | None:
        """Starts the server for `flags`; None, "time cap", or what went wrong, in words."""
        serve_args = (self.args.serve_args + " " + shlex.join(flags)).strip()
        self.log_path = self.log_dir / f"trial-{len(self.done) + 1}.log"
        try:
            self.server = bs.ServerProcess(self.args.vlm, self.args.model, serve_args,
                                           str(self.log_path))
        except OSError as e:
            return f"cannot run {self.args.vlm}: {e}"
        until = time.monotonic() + min(self.args.startup_timeout, max(self.remaining(), 0.0))
        try:
            loop = asyncio.get_running_loop()
            self.base = await loop.run_in_executor(None, self.server.wait_url,
                                                   until - time.monotonic())
            await bs.wait_health(side, self.base, max(until - time.monotonic(), 0.0),
                                 self.server)
        except SystemExit as e:
            if self.remaining() <= 0:
                return "time cap"
            tail = self.server.tail(5).strip().replace("\n", " | ")
            return f"{str(e).splitlines()[0].removeprefix('bench_serve: ')}: {tail}"
        model = self.args.model_name
        if model is None:
            served = await bs.served_models(side, self.base)
            model = served[0] if served else "default"
        if model != self.model:  # the bodies name it: made again, with the same images
            self.model, self.bodies, self.warmup = model, [], None
            self.images = self.make_images()
        return None

    async def _bounded(self, work, what: str) -> tuple[Any, Trial | None]:
        """`work` within what is left of the trial's time (--trial-timeout from its warm-up, and
        the search's deadline); (its result, None), or (None, the trial's "time cap" / "timeout"
        outcome) when it ran out."""
        left = self.trial_deadline - time.monotonic()
        try:
            return await asyncio.wait_for(work, max(left, 0.001)), None
        except asyncio.TimeoutError:
            capped = self.trial_deadline >= self.deadline
            return None, Trial({}, 0, "time cap" if capped else "timeout",
                               reason=f"{what} not done within the "
                               f"{'search' if capped else 'trial'}'s time")

    async def _trial(self, setting: dict, n: int) -> Trial:
        a = self.args
        key = a.api_key or (a.serve_api_key if isinstance(a.serve_api_key, str) else None)
        client, side = bs.clients(n, key, a.timeout)
        async with client, side:
            err = await self._start(setting_flags(setting, n), side)
            if err == "time cap":
                return Trial(setting, n, "time cap", reason="the server was still starting")
            if err:
                return Trial(setting, n, "server failed", reason=err)
            # Warm-up requests, one at a time; the last one's time spreads the first starts.
            self.trial_deadline = min(time.monotonic() + a.trial_timeout, self.deadline)
            stagger = 0.0
            for _ in range(a.warmup):
                body, nbytes = self.warmup_body()
                res, out = await self._bounded(bs.send_request(
                    client, self.base + "/v1/chat/completions", {}, body, -1, nbytes, a.timeout),
                    "the warm-up request")
                if out is not None:
                    out.setting, out.load = setting, n
                    return out
                if not res.ok:
                    return Trial(setting, n, "failed", reason=f"warm-up request: {res.error}")
                stagger = res.e2e / n
            # At least two waves: a window with all N in flight (steady_throughput).
            count = max(2 * n, a.requests_per_trial or max(a.min_requests, a.waves * n))
            if a.recorded and count > len(a.recorded) - 1 and not self.said_repeats:
                self.said_repeats = True
                bs.log(a, f"tune: note: {count} requests a trial (and the warm-up) from "
                          f"{len(a.recorded)} recorded ones: some repeat (and may hit the "
                          f"server's caches)")
            bodies = self.workload(count)
            rss: list[int] = []

            async def watch_rss() -> None:
                while True:
                    v = proc_rss_bytes(self.server.proc.pid)
                    if v is not None:
                        rss.append(v)
                    await asyncio.sleep(0.25)

            watcher = asyncio.create_task(watch_rss())
            try:
                level, out = await self._bounded(bs.run_level(
                    a, client, side, self.base, self.model, self.images, n, count, 0,
                    stagger_s=stagger, bodies=bodies), "the trial's requests")
            finally:
                watcher.cancel()
            if out is not None:
                out.setting, out.load = setting, n
                return out
        return self._judge(setting, n, level[0], max(rss) if rss else None)

    def _judge(self, setting: dict, n: int, summary: dict, rss: int | None) -> Trial:
        gauges = summary["server_metrics"].get("gauges_after", {})
        kv_bytes = gauges.get("vlm_kv_cache_memory_bytes")
        state_bytes = gauges.get("vlm_state_memory_bytes")  # a hybrid model's, out of the budget
        blocks = gauges.get("vlm_kv_cache_blocks_capacity")
        peak_blocks = summary["server"]["peaks"].get("vlm_kv_cache_blocks_used")
        steady = steady_throughput(summary, n)
        tokens = summary["total_output_tokens"] / max(summary["completed"], 1)
        figures = {
            "requests": summary["num_requests"],
            "failed": summary["failed"],
            # While all N were in flight (the whole trial's where there was no such window).
            "request_throughput": summary["request_throughput"] if steady is None or not tokens
            else steady / tokens,
            "request_throughput_whole": summary["request_throughput"],
            "output_throughput_whole": summary["output_throughput"],
            "steady_window": steady is not None,
            "peak_running": summary["server"]["peaks"].get("vlm_num_requests_running"),
            "rss_peak_bytes": rss,
            # What the memory budget holds: K/V and, for a hybrid model, its state slots.
            "kv_reserved_bytes": None if kv_bytes is None else kv_bytes + (state_bytes or 0),
            "state_reserved_bytes": state_bytes,
            "kv_peak_used_bytes": (kv_bytes * peak_blocks / blocks
                                   if kv_bytes and blocks and peak_blocks is not None else None),
            "preemptions": summary["server"].get("preemptions"),
        }
        for key, _ in METRICS:
            figures[f"{key}_ms"] = summary[f"{key}_ms"]
        t = Trial(setting, n, "meets", summary["output_throughput"] if steady is None else steady,
                  figures=figures)
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
    """`vlm serve` flags as --config keys: --name value (or several values), --name=value,
    --flag (true), the short options by their long names; a repeated option becomes a list. A
    value that begins with '-' (other than a number) must be written --name=value. ValueError
    for what it cannot read."""
    out: dict[str, Any] = {}
    toks = shlex.split(serve_args)
    numeric = re.compile(r"-?\d+(\.\d+)?$")
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok.startswith("--") and len(tok) > 2:
            name, sep, value = tok[2:].partition("=")
            values = [value] if sep else []
        elif tok in SHORT_OPTIONS:
            name, values = SHORT_OPTIONS[tok], []
        else:
            raise ValueError(f"cannot read {tok!r} (long options, or {', '.join(SHORT_OPTIONS)})")
        i += 1
        while i < len(toks) and (not toks[i].startswith("-") or numeric.match(toks[i])):
            values.append(toks[i])
            i += 1
        value: Any = True if not values else values[0] if len(values) == 1 else values
        if name in out:
            prev = out[name]
            out[name] = (prev if isinstance(prev, list) else [prev]) + \
                (value if isinstance(value, list) else [value])
        else:
            out[name] = value
    return out


def yaml_scalar(v: Any) -> str:
    """A YAML scalar: true, a number as it is, anything else double-quoted."""
    if v is True:
        return "true"
    s = str(v)
    return s if re.fullmatch(r"-?\d+(\.\d+)?", s) else json.dumps(s)


def config_yaml(args: argparse.Namespace, best: Trial, header: list[str]) -> str:
    """The recommendation as a `vlm serve --config` file."""
    keys = serve_args_mapping(args.serve_args)
    tuned = setting_keys(best.setting, best.load)
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


def setting_label(setting: dict) -> str:
    flags = setting_flags(setting, 0)[2:]
    return " ".join(flags) if flags else "server defaults"


def plot(trials: list[Trial], objective: Objective, best: Trial | None, path: str,
         title: str) -> None:
    """One series a setting: throughput and the objective's latencies against max-num-seqs,
    and throughput against the server's peak resident memory (o: meets, x: misses)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [t for t in trials if "request_throughput" in t.figures]
    series: dict[str, list[Trial]] = {}
    for t in measured:
        series.setdefault(setting_label(t.setting), []).append(t)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax_tp, ax_lat, ax_mem = axes
    pct = objective.percentile
    bounded = [(key, name) for key, name in METRICS if getattr(objective, key) is not None]
    styles = ("-", "--", ":")
    for i, (label, ts) in enumerate(series.items()):
        color = f"C{i % 10}"
        ts = sorted(ts, key=lambda t: t.load)
        ax_tp.plot([t.load for t in ts], [t.throughput for t in ts], color=color, alpha=0.5)
        for t in ts:
            mark = "o" if t.meets else "x"
            ax_tp.scatter(t.load, t.throughput, color=color, marker=mark)
            rss = t.figures.get("rss_peak_bytes")
            if rss:
                ax_mem.scatter(rss / 2**20, t.throughput, color=color, marker=mark)
        ax_tp.plot([], [], color=color, label=label)
        for (key, name), style in zip(bounded, styles):
            pts = [(t.load, t.figures[f"{key}_ms"].get(f"p{pct}"), t.meets) for t in ts
                   if t.figures[f"{key}_ms"].get(f"p{pct}") is not None]
            ax_lat.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, alpha=0.5,
                        label=f"{name}: {label}")
            for x, y, ok in pts:
                ax_lat.scatter(x, y, color=color, marker="o" if ok else "x")
    for (key, name), style in zip(bounded, styles):
        ax_lat.axhline(getattr(objective, key), color="black", linestyle=style, linewidth=1,
                       label=f"{name} objective")
    if best is not None:
        ax_tp.scatter(best.load, best.throughput, s=200, facecolors="none", edgecolors="black",
                      label="recommended")
    ax_tp.set(xlabel="max-num-seqs (= requests in flight)", ylabel="output tok/s",
              title="throughput while all N are in flight (o meets, x misses)")
    ax_lat.set(xlabel="max-num-seqs (= requests in flight)", ylabel="ms",
               title=f"the objective's latency (p{pct})")
    ax_mem.set(xlabel="server peak RSS during the trial (MiB)", ylabel="output tok/s",
               title="throughput against memory")
    ax_tp.legend(fontsize=7)
    ax_lat.legend(fontsize=7)
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def trials_from_json(doc: dict) -> tuple[list[Trial], Trial | None]:
    """The trials (and the recommendation) of an --out-json file, to draw them again."""
    trials = [Trial(t["setting"], t["max_num_seqs"], t["status"], t["throughput"], t["reason"],
                    t["figures"]) for t in doc["trials"]]
    rec = doc.get("recommended")
    best = next((t for t in trials if rec and t.setting == rec["setting"]
                 and t.load == rec["max_num_seqs"]), None)
    return trials, best


# --------------------------------------------------------------------------- main


def number(text: str) -> int | float:
    """An int where the text is one, else a float (ValueError otherwise)."""
    try:
        return int(text)
    except ValueError:
        v = float(text)
        if not math.isfinite(v):
            raise
        return v


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
    p.add_argument("--server-log-dir", help="where each trial's server log goes (trial-1.log, "
                   "...); a temporary folder if unset")
    bs.add_workload_args(p)
    o = p.add_argument_group("objective (milliseconds, at --slo-percentile; at least one)")
    o.add_argument("--slo-ttft", type=float, help="time to first token")
    o.add_argument("--slo-itl", type=float, help="inter-token latency")
    o.add_argument("--slo-e2e", type=float, help="whole request")
    o.add_argument("--slo-percentile", type=int, default=99, choices=bs.PERCENTILES)
    s = p.add_argument_group("search (a list that begins with a negative value: --name=-1,auto)")
    s.add_argument("--seqs-min", type=int, default=1, help="smallest --max-num-seqs")
    s.add_argument("--seqs-max", type=int, default=64, help="largest --max-num-seqs")
    s.add_argument("--seqs-start", type=int, default=1, help="the first --max-num-seqs tried")
    s.add_argument("--max-batched-tokens", default="auto",
                   help="values to try, comma-separated (auto: the server's default)")
    s.add_argument("--max-encoder-ms", default="auto", help="values to try (-1: whole encodes)")
    s.add_argument("--kv-cache-dtype", default="auto", help="values to try (auto,bf16,int8,f32)")
    s.add_argument("--kv-cache-memory", default="auto", help="values to try, in bytes")
    s.add_argument("--tolerance", type=float, default=0.03,
                   help="throughputs this close count as equal (then the less KV memory, then "
                   "the smaller N, wins)")
    s.add_argument("--duration", type=float, default=600.0,
                   help="seconds for the whole search, server starts included")
    s.add_argument("--trial-timeout", type=float, default=300.0,
                   help="seconds one trial may take (then it counts as missing)")
    s.add_argument("--waves", type=int, default=3,
                   help="requests per trial: this many times N (at least --min-requests)")
    s.add_argument("--min-requests", type=int, default=8)
    s.add_argument("--requests-per-trial", type=int, default=0,
                   help="a fixed count instead (at least 2 N)")
    out = p.add_argument_group("output")
    out.add_argument("--out-json", default="tune_serve.json", help="'' to skip")
    out.add_argument("--out-png", default="tune_serve.png", help="'' to skip")
    out.add_argument("--out-config", default="tuned.yaml",
                     help="the recommendation as a `vlm serve --config` file ('' to skip)")
    out.add_argument("--quiet", action="store_true", help="no per-trial progress on stderr")
    out.add_argument("--replot", metavar="FILE.json",
                     help="only draw an earlier run's plot again (to --out-png)")
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
    if args.slo_itl is not None and args.output_len < 2 and not args.recorded:
        p.error("--slo-itl needs replies of two tokens or more (--output-len)")
    if not 1 <= args.seqs_min <= args.seqs_max:
        p.error("--seqs-min and --seqs-max: 1 <= min <= max")
    if not 0 <= args.tolerance < 1:
        p.error("--tolerance must be in [0, 1)")
    if args.duration <= 0 or args.trial_timeout <= 0:
        p.error("--duration and --trial-timeout must be positive")
    if args.waves < 2 or args.min_requests < 1 or args.requests_per_trial < 0:
        p.error("--waves must be >= 2 (a window with all N in flight), --min-requests >= 1, "
                "--requests-per-trial >= 0")
    if args.warmup < 1:
        p.error("--warmup must be >= 1: its time spreads each trial's first starts")
    args.space = {
        "max-batched-tokens": value_list(args.max_batched_tokens, int, "max-batched-tokens", p),
        "max-encoder-ms": value_list(args.max_encoder_ms, number, "max-encoder-ms", p),
        "kv-cache-dtype": value_list(args.kv_cache_dtype, str, "kv-cache-dtype", p),
        "kv-cache-memory": value_list(args.kv_cache_memory, int, "kv-cache-memory", p),
    }
    try:
        taken = serve_args_mapping(args.serve_args)
    except ValueError as e:
        p.error(f"--serve-args: {e}")
    refused = {d: "which the tuner searches: give its values to the tuner's --" + d
               for d in ("max-num-seqs",) + DIMENSIONS}
    refused.update({"model": "give it to the tuner (-m)",
                    "port": "the tuner gives each server a free port",
                    "config": "give the file's options instead"})
    if args.space["kv-cache-memory"] != ["auto"]:
        refused["num-blocks"] = "it would override the searched --kv-cache-memory"
    for name, why in refused.items():
        if name in taken:
            p.error(f"--serve-args sets --{name}: {why}")
    args.serve_api_key = taken.get("api-key")  # the tuner's requests carry it
    if Path(args.model).exists():  # the config file works from any folder
        args.model = str(Path(args.model).resolve())
    return args


def replot(argv: list[str]) -> int:
    """`--replot FILE.json --out-png FILE.png`: the plot of an earlier run, drawn again."""
    p = argparse.ArgumentParser(description="Draw an earlier run's plot again.")
    p.add_argument("--replot", required=True, metavar="FILE.json", help="its --out-json file")
    p.add_argument("--out-png", required=True)
    p.add_argument("--vlm", help=argparse.SUPPRESS)  # what `vlm tune` passes, not needed here
    args = p.parse_args(argv)
    try:
        doc = json.loads(Path(args.replot).read_text())
        o = doc["objective"]
        objective = Objective(o["ttft_ms"], o["itl_ms"], o["e2e_ms"], o["percentile"])
        trials, best = trials_from_json(doc)
    except (OSError, ValueError, KeyError, TypeError) as e:
        p.error(f"--replot {args.replot}: not a tune_serve.py JSON file ({type(e).__name__}: {e})")
    plot(trials, objective, best, args.out_png,
         f"vlm tune — {doc['workload']} — {objective.describe()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--replot" or a.startswith("--replot=") for a in argv):
        return replot(argv)
    args = parse_args(argv)
    objective = Objective(args.slo_ttft, args.slo_itl, args.slo_e2e, args.slo_percentile)
    runner = TrialRunner(args, objective, time.monotonic() + args.duration)
    bs.log(args, f"tune: {bs.workload_title(args)}; objective {objective.describe()}; "
                 f"at most {args.duration:g} s; server logs in {runner.log_dir}")
    search = Search(runner, args.space, args.seqs_min, args.seqs_max, args.seqs_start,
                    args.tolerance)
    try:
        best = search.run()
    finally:
        runner.stop()
    rc = report(args, objective, search, best)
    return 130 if search.stopped == "interrupted" else rc


def no_answer(args: argparse.Namespace, search: Search) -> str:
    """Why there is no recommendation, in words."""
    at_min = [t for t in search.trials if t.load == args.seqs_min and t.status == "misses"]
    if at_min:
        return (f"even --max-num-seqs {args.seqs_min} misses it on this workload (trial "
                f"{search.trials.index(at_min[0]) + 1}: {at_min[0].reason})")
    if search.stopped:
        return f"the search ended ({search.stopped}) before any trial met it"
    return "no trial met it: see the table (a failed server or request says why)"


def report(args: argparse.Namespace, objective: Objective, search: Search,
           best: Trial | None) -> int:
    """The table, the answer (command line and --config file), the JSON and the plot; the exit
    code: 0 with a recommendation, 3 without."""
    searched = [d for d in DIMENSIONS if len(args.space[d]) > 1 or args.space[d][0] != "auto"]
    pct = objective.percentile
    print(trials_table(search.trials, searched, pct))
    date = _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")
    header = [f"{CONFIG_HEADER} on {date}",
              f"workload: {bs.workload_title(args)}",
              f"objective: {objective.describe()}"]
    early = {"time cap": " (the --duration cap ended the search: the best found so far)",
             "interrupted": " (interrupted: the best found so far)", "": ""}.get(
        search.stopped, f" (the search stopped on an error, {search.stopped[7:]}: the best "
                        f"found so far)")
    if best is None:
        print(f"\nNo setting met the objective ({objective.describe()}): "
              f"{no_answer(args, search)}.")
        old = Path(args.out_config) if args.out_config else None
        if old is not None and old.is_file() and \
                old.read_text(errors="replace").startswith(f"# {CONFIG_HEADER}"):
            old.unlink()  # an earlier run's answer is not this one's
    else:
        f = best.figures
        lat = ", ".join(f"{name} p{pct} {_ms(best, key, pct)} ms" for key, name in METRICS)
        measured = (f"measured: {best.throughput:.2f} output tok/s, "
                    f"{f['request_throughput']:.3f} req/s at {best.load} in flight; {lat}; "
                    f"peak RSS {_mib(f.get('rss_peak_bytes'))} MiB, KV reserved "
                    f"{_mib(f.get('kv_reserved_bytes'))} MiB")
        header.append(measured)
        print(f"\nRecommended{early}: {measured}\n\n    {serve_command(args, best)}\n")
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
        "stopped": search.stopped or None,
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
        except Exception as e:  # noqa: BLE001 - the table, answer and JSON are already out
            print(f"tune_serve: warning: could not draw {args.out_png}: {type(e).__name__}: {e}",
                  file=sys.stderr)
    if search.stopped.startswith("error"):
        return 1
    return 0 if best is not None else 3


if __name__ == "__main__":
    sys.exit(main())
