#!/usr/bin/env python3
"""N `vlm serve` replicas behind the Shepherd Model Gateway (`smg`, formerly SGLang's router), on
this machine's loopback, with the field's router unchanged. Shows, and checks:

1. equal replies: each request sent through the router gets the reply the same request gets
   straight from a replica (greedy and seeded sampling, text and images); and smg reads each
   replica's load from its GET /v1/loads;
2. cache-aware routing: a multi-turn image chat workload, once behind `--policy cache_aware`
   and once behind `--policy round_robin` (fresh replicas each time); the prefix-cache hit rate
   across replicas (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, summed over
   the replicas' /metrics) must be higher with cache-aware routing;
3. SIGTERM to one replica under load: its /health turns 503 while it drains, its running
   requests complete, it exits 0, and no client request fails;
4. kill -9 of one replica under load: how many client requests fail, and over how long, before
   the router stops sending to it.

    VENV/bin/python scripts/router_demo.py --vlm build/tools/cli/vlm [--smg VENV/bin/smg]
        [--replicas 2|3] [--pin] [--quick] [--json out.json]

The replicas serve the shipped demo model (or -m DIR). Exits non-zero when a check fails.
"""

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

MODEL = "tiny"
QUESTIONS = ["How many shapes are there?", "What colour is the circle?", "Where is the triangle?",
             "How many squares are there?", "Describe the image."]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def png(width, height, rects, background=(255, 255, 255)):
    """An RGB PNG with filled rectangles [(x0, y0, x1, y1, (r, g, b))], standard library only."""
    px = [[background] * width for _ in range(height)]
    for x0, y0, x1, y1, colour in rects:
        for y in range(y0, y1):
            for x in range(x0, x1):
                px[y][x] = colour
    raw = b"".join(b"\x00" + b"".join(bytes(p) for p in row) for row in px)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def image_part(data):
    import base64
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def http(method, url, body=None, timeout=120):
    """(status, parsed JSON or text); a connection failure is status 0."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(errors="replace"), e.code
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
        return 0, str(e)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def metrics(url):
    """{name{labels}: value} of a Prometheus text page (samples only)."""
    status, text = http("GET", url + "/metrics")
    out = {}
    if status != 200:
        return out
    for line in str(text).splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def metric_sum(page, prefix):
    return sum(v for k, v in page.items() if k == prefix or k.startswith(prefix + "{"))


class Child:
    """A process started with its output in self.log; stop() sends SIGTERM (a vlm replica
    drains), waits up to 40 s, then kills."""

    def start(self, cmd, ready, what, timeout=60):
        """Starts `cmd` and waits up to `timeout` s for ready(); stopped again when it is not."""
        try:
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        except OSError as e:
            self.log.close()
            raise RuntimeError(f"{what}: cannot run {cmd[0]}: {e.strerror}") from None
        try:
            wait_for(ready, timeout, what, self.proc)
        except RuntimeError:
            self.stop()
            raise

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Replica(Child):
    """`vlm serve` of `model` (default: the demo model) on a free port, one compute thread, pinned
    to `cpu` when given; `extra`: more flags. Ready once /health answers 200."""

    def __init__(self, vlm, workdir, name, model="", cpu=None, extra=(), start_timeout=60):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [vlm, "serve", "--port", str(self.port), "--served-model-name", MODEL, "-t", "1",
               *(["-m", model] if model else []), *extra]
        if cpu is not None:
            cmd = ["taskset", "-c", str(cpu)] + cmd
        self.log = open(Path(workdir) / f"replica{name}.log", "wb")
        self.start(cmd, lambda: http("GET", self.url + "/health", timeout=2)[0] == 200,
                   f"replica {name} /health", start_timeout)


class Router(Child):
    """`smg launch` on a free port in front of `urls` with `policy`; `flags`: more options. Ready
    once a chat request through it succeeds."""

    def __init__(self, smg, workdir, urls, policy, flags=()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(Path(workdir) / f"router-{policy}.log", "wb")
        cmd = [smg, "launch", "--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
               "--worker-urls", *urls, "--log-level", "warn", "--prometheus-port", str(free_port()),
               *flags]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        self.start(cmd, lambda: http("POST", self.url + "/v1/chat/completions", body, timeout=5)[0] == 200,
                   f"smg ({policy}) answering")
        self.cpu0 = cpu_seconds(self.proc.pid)


# The demo's router notices a replica's health and load within a second.
DEMO_ROUTER_FLAGS = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                     "--load-monitor-interval", "1"]


@contextlib.contextmanager
def cluster(args, workdir, policy):
    """Fresh replicas (empty caches) and smg in front of them with `policy`; all stopped on exit,
    those already started included when one fails to start."""
    replicas, router = [], None
    try:
        for i in range(args.replicas):
            cpu = i % os.cpu_count() if args.pin else None
            replicas.append(Replica(args.vlm, workdir, i, args.model, cpu,
                                    ["--shutdown-timeout", "30"]))
        router = Router(args.smg, workdir, [r.url for r in replicas], policy, DEMO_ROUTER_FLAGS)
        yield replicas, router
    finally:
        for child in ([router] if router else []) + replicas:
            child.stop()


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(ok, timeout, what, proc=None):
    deadline = time.monotonic() + timeout
    while not ok():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited ({proc.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: timed out")
        time.sleep(0.1)


def chat(url, messages, **kw):
    body = {"model": MODEL, "messages": messages, "max_tokens": kw.pop("max_tokens", 24),
            "temperature": kw.pop("temperature", 0), **kw}
    return http("POST", url + "/v1/chat/completions", body)


def chat_stream(url, messages, max_tokens, started=None):
    """A streamed chat request: (status, error text or ""). Status 200 only when the stream ran
    to its end: [DONE] after a finish_reason and max_tokens tokens (ignore_eos). `started` (a
    threading.Event, optional) is set at its first chunk."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    finish = usage = None
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    if finish == "length" and usage == max_tokens:
                        return 200, ""
                    return 599, f"ended with finish_reason {finish}, {usage} tokens"
                chunk = json.loads(line[6:])
                if started is not None:
                    started.set()
                for c in chunk.get("choices", []):
                    finish = c.get("finish_reason") or finish
                if chunk.get("usage"):
                    usage = chunk["usage"]["completion_tokens"]
        return 598, "the stream was cut before [DONE]"
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:200]
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError) as e:
        return 0, str(e)[:200]


def scene(rng):
    """A random picture of a few coloured rectangles."""
    colours = [(230, 40, 40), (40, 90, 230), (250, 200, 30), (40, 170, 70), (240, 130, 20)]
    rects = []
    for _ in range(rng.randint(1, 3)):
        x, y, s = rng.randrange(0, 150), rng.randrange(0, 150), rng.randrange(20, 60)
        rects.append((x, y, min(x + s, 224), min(y + s, 224), rng.choice(colours)))
    return png(224, 224, rects)


class Report:
    def __init__(self):
        self.failures = []
        self.results = {}

    def check(self, ok, what):
        print(("  ok    " if ok else "  FAIL  ") + what, flush=True)
        if not ok:
            self.failures.append(what)


def equal_replies(rep, router, replica, rng, n):
    """1. The router changes nothing in a reply."""
    print("1. replies through the router equal replies straight from a replica", flush=True)
    same = 0
    for i in range(n):
        content = [image_part(scene(rng)), {"type": "text", "text": rng.choice(QUESTIONS)}] \
            if i % 2 == 0 else f"Say something about the number {i}."
        kw = {"temperature": 0.8, "seed": 1000 + i} if i % 3 == 2 else {}
        msgs = [{"role": "user", "content": content}]
        a = chat(router.url, msgs, **kw)
        b = chat(replica.url, msgs, **kw)
        ok = a[0] == b[0] == 200 and a[1]["choices"][0]["message"] == b[1]["choices"][0]["message"]
        same += ok
    rep.results["equal_replies"] = {"requests": n, "equal": same}
    rep.check(same == n, f"{same}/{n} replies equal (greedy and seeded sampling, text and images)")


def router_reads_loads(rep, router, replicas):
    """smg polls each replica's GET /v1/loads (SGLang's load endpoint) and reports what it read
    at its own GET /get_loads: each replica's KV capacity and batch size as the replica states
    them in /server_info."""
    want = {}
    for r in replicas:
        _, info = http("GET", r.url + "/server_info")
        want[r.url] = (info["max_total_tokens"], info["max_running_requests"])
    got = {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and got != want:
        status, loads = http("GET", router.url + "/get_loads")
        if status == 200 and isinstance(loads, dict):
            got = {l["worker"]: (l["max_total_num_tokens"], l["max_running_requests"])
                   for l in loads.get("loads", []) if "worker" in l}
        time.sleep(0.5)
    rep.results["router_loads"] = {"read": len(got), "replicas": len(want)}
    rep.check(got == want, f"smg read every replica's /v1/loads ({len(got)}/{len(want)}: "
                           f"KV capacity and batch size as /server_info states them)")


def multi_turn(router, replicas, rng, conversations, turns, concurrency):
    """2. Multi-turn chats, each conversation's turns in order, conversations in parallel.
    Returns (hit rate over the replicas, client errors)."""
    before = [metrics(r.url) for r in replicas]
    errors = [0]
    lock = threading.Lock()
    work = list(range(conversations))

    def run_conversation(c):
        crng = random.Random(rng.random() + c)
        system = " ".join(crng.choice(["red", "blue", "square", "circle", "left", "right", "top",
                                       "shape", "count", "colour"]) for _ in range(60))
        msgs = [{"role": "system", "content": f"Conversation {c}. {system}"},
                {"role": "user", "content": [image_part(scene(crng)),
                                             {"type": "text", "text": "Describe the image."}]}]
        for t in range(turns):
            status, reply = chat(router.url, msgs, max_tokens=16)
            if status != 200:
                with lock:
                    errors[0] += 1
                return
            msgs.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
            msgs.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})

    def worker():
        while True:
            with lock:
                if not work:
                    return
                c = work.pop()
            run_conversation(c)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = [metrics(r.url) for r in replicas]
    hits = sum(metric_sum(a, "vllm:prefix_cache_hits_total") - metric_sum(b, "vllm:prefix_cache_hits_total")
               for a, b in zip(after, before))
    queries = sum(metric_sum(a, "vllm:prefix_cache_queries_total") -
                  metric_sum(b, "vllm:prefix_cache_queries_total") for a, b in zip(after, before))
    per_replica = [metric_sum(a, "vlm_requests_total") - metric_sum(b, "vlm_requests_total")
                   for a, b in zip(after, before)]
    return (hits / queries if queries else 0.0), errors[0], per_replica


class Load:
    """Clients streaming chat requests through the router until stopped; records each outcome."""

    def __init__(self, url, clients, rng):
        self.url, self.stop_flag, self.records = url, threading.Event(), []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, args=(random.Random(rng.random()),))
                        for _ in range(clients)]
        for t in self.threads:
            t.start()

    def client(self, rng):
        while not self.stop_flag.is_set():
            msgs = [{"role": "user", "content": [image_part(scene(rng)),
                                                 {"type": "text", "text": rng.choice(QUESTIONS)}]}]
            t0 = time.monotonic()
            # Streamed (a router cannot retry a stream that has begun, so a request cut on the
            # replica shows here), and long enough that requests are running on the replica
            # when it is stopped.
            status, error = chat_stream(self.url, msgs, max_tokens=256)
            with self.lock:
                self.records.append((t0, time.monotonic(), status, error))

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join()
        return sorted(self.records)


def sigterm_under_load(rep, args, workdir, rng):
    print("3. SIGTERM to one replica under load", flush=True)
    with cluster(args, workdir, "cache_aware") as (replicas, router):
        load = Load(router.url, args.clients, rng)
        time.sleep(args.phase_seconds / 3)
        victim = replicas[-1]
        # Stop it while it is streaming: a drain with nothing running would prove little. A long
        # stream of its own keeps the drain open for more than a /health poll (the load's short
        # replies can all end within one).
        long_reply, long_started = [], threading.Event()
        long_thread = threading.Thread(target=lambda: long_reply.append(chat_stream(
            victim.url, [{"role": "user", "content": "Describe the image."}], 1500,
            started=long_started)))
        long_thread.start()
        long_started.wait(timeout=args.phase_seconds)
        deadline = time.monotonic() + args.phase_seconds
        before = metrics(victim.url)
        while metric_sum(before, "vlm_num_requests_running") < 1 and time.monotonic() < deadline:
            before = metrics(victim.url)
        t_term = time.monotonic()
        victim.proc.send_signal(signal.SIGTERM)
        saw_503, last = False, before
        while victim.proc.poll() is None and time.monotonic() - t_term < 40:
            status, _ = http("GET", victim.url + "/health", timeout=2)
            saw_503 = saw_503 or status == 503
            page = metrics(victim.url)
            last = page or last
            time.sleep(0.05)
        drained_s = time.monotonic() - t_term
        exit_code = victim.proc.wait(timeout=40)
        long_thread.join()
        time.sleep(args.phase_seconds / 3)
        records = load.stop()
    errors = [r for r in records if r[2] != 200]
    after_term = [r for r in records if r[0] > t_term + drained_s]
    in_flight = [r for r in records if r[0] < t_term < r[1]]
    running = metric_sum(before, "vlm_num_requests_running")
    rejected = (metric_sum(last, 'vlm_requests_total{outcome="rejected"}') -
                metric_sum(before, 'vlm_requests_total{outcome="rejected"}'))
    rep.results["sigterm"] = {"requests": len(records), "client_errors": len(errors),
                              "drain_seconds": round(drained_s, 2), "exit_code": exit_code,
                              "running_at_sigterm": running,
                              "refused_while_draining": rejected,
                              "streams_in_flight_at_sigterm": len(in_flight),
                              "requests_after_exit": len(after_term)}
    print(f"  {running:.0f} requests streaming on it at SIGTERM; at least {rejected:.0f} new ones "
          f"refused while it drained (503: the router sent them elsewhere)", flush=True)
    rep.check(running >= 1, "the replica was streaming when stopped")
    rep.check(saw_503, "the draining replica's /health answered 503")
    rep.check(long_reply == [(200, "")],
              f"its own long stream ran to its end through the drain ({long_reply})")
    rep.check(exit_code == 0, f"it exited 0 after draining {drained_s:.1f} s")
    rep.check(not errors, f"{len(errors)} of {len(records)} client streams failed (a stream cannot "
              f"be retried: those running on the replica ran to their end)"
              + (f" (first: {errors[0][3]})" if errors else ""))
    rep.check(len(after_term) > 0, f"{len(after_term)} requests served by the others after it left")


def kill_under_load(rep, args, workdir, rng):
    print("4. kill -9 of one replica under load", flush=True)
    with cluster(args, workdir, "cache_aware") as (replicas, router):
        load = Load(router.url, args.clients, rng)
        time.sleep(args.phase_seconds / 3)
        running = metric_sum(metrics(replicas[-1].url), "vlm_num_requests_running")
        t_kill = time.monotonic()
        replicas[-1].proc.kill()
        replicas[-1].proc.wait()
        time.sleep(2 * args.phase_seconds / 3)
        records = load.stop()
    errors = [r for r in records if r[2] != 200]
    window = (max(r[1] for r in errors) - t_kill) if errors else 0.0
    after = [r for r in records if r[0] > t_kill + max(window, 0) and r[2] == 200]
    rep.results["kill9"] = {"requests": len(records), "running_at_kill": running,
                            "client_errors": len(errors),
                            "errors_within_seconds": round(window, 2),
                            "ok_after_errors": len(after),
                            "statuses": sorted({r[2] for r in errors})}
    print(f"  {running:.0f} requests running on it when killed; "
          f"{len(errors)} of {len(records)} client streams failed, the last "
          f"{window:.1f} s after the kill; {len(after)} succeeded after that", flush=True)
    rep.check(len(after) > 0, "requests fail over to the replicas left")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vlm", required=True, help="the vlm binary")
    ap.add_argument("--smg", default=str(Path(sys.executable).parent / "smg"),
                    help="the smg executable (pip install smg==1.13.0; default: the one beside "
                         "this Python, as in scripts/requirements-test.txt's venv)")
    ap.add_argument("-m", "--model", default="", help="model directory (default: the shipped demo model)")
    ap.add_argument("--replicas", type=int, default=2, choices=[2, 3])
    ap.add_argument("--quick", action="store_true", help="a smaller workload (the test suite's)")
    ap.add_argument("--pin", action="store_true", help="pin replica i to CPU i (taskset)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for k in ("NO_PROXY", "no_proxy"):
        os.environ[k] = ",".join(filter(None, [os.environ.get(k, ""), "127.0.0.1", "localhost"]))
    args.clients = 4
    args.phase_seconds = 6 if args.quick else 15
    conversations, turns = (8, 4) if args.quick else (24, 6)
    rng = random.Random(args.seed)
    rep = Report()
    with tempfile.TemporaryDirectory(prefix="vlm_router_demo_") as workdir:
        try:
            with cluster(args, workdir, "cache_aware") as (replicas, router):
                equal_replies(rep, router, replicas[0], rng, 6 if args.quick else 20)
                router_reads_loads(rep, router, replicas)
            print("2. multi-turn chats: prefix-cache hit rate across replicas", flush=True)
            rates = {}
            for policy in ("cache_aware", "round_robin"):
                with cluster(args, workdir, policy) as (replicas, router):
                    t0 = time.monotonic()
                    rate, errors, per_replica = multi_turn(router, replicas, random.Random(args.seed),
                                                           conversations, turns, concurrency=4)
                    router_cpu = cpu_seconds(router.proc.pid) - router.cpu0
                    rates[policy] = {"hit_rate": round(rate, 4), "client_errors": errors,
                                     "requests_per_replica": per_replica,
                                     "seconds": round(time.monotonic() - t0, 2),
                                     "router_cpu_seconds": round(router_cpu, 2)}
                print(f"  {policy:12s} hit rate {rate:.1%}, requests per replica {per_replica}, "
                      f"{errors} client errors", flush=True)
            rep.results["multi_turn"] = {"conversations": conversations, "turns": turns, **rates}
            ca, rr = rates["cache_aware"]["hit_rate"], rates["round_robin"]["hit_rate"]
            rep.check(ca > rr, f"cache-aware routing hits more of the prefix cache ({ca:.1%} vs {rr:.1%})")
            rep.check(rates["cache_aware"]["client_errors"] == rates["round_robin"]["client_errors"] == 0,
                      "no client errors in the chats")
            sigterm_under_load(rep, args, workdir, rng)
            kill_under_load(rep, args, workdir, rng)
        except RuntimeError as e:
            rep.check(False, str(e))
            for p in sorted(Path(workdir).glob("*.log")):
                print(f"--- {p.name}\n" + p.read_text(errors="replace")[-2000:], file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(rep.results, indent=2) + "\n")
    print(json.dumps(rep.results, indent=2))
    if rep.failures:
        print(f"{len(rep.failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
