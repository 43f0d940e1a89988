"""Helpers the server tests share: their command line, a `vlm serve` subprocess, the test model
directory, metrics."""

import argparse
import os
import re
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny"
CTX = 512
TIMEOUT = 60.0


def run_tests(args_ns, doc, add_arguments=None, model_dir=True):
    """A server test's main: --vlm and --model-dir (required unless `model_dir` is false; and what
    `add_arguments(parser)` adds) set on `args_ns`, other options passed to unittest, which then
    runs the calling script's tests."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vlm", required=True, help="the vlm binary")
    ap.add_argument("--model-dir", required=model_dir,
                    help="tests/model/fixtures/tiny-fullvocab-bf16")
    if add_arguments is not None:
        add_arguments(ap)
    args, rest = ap.parse_known_args()
    # Talk to 127.0.0.1 directly even where HTTP(S)_PROXY is set (CI with a package proxy).
    for k in ("NO_PROXY", "no_proxy"):
        os.environ[k] = ",".join(filter(None, [os.environ.get(k, ""), "127.0.0.1", "localhost"]))
    vars(args_ns).update(vars(args))
    args_ns.vlm = str(Path(args.vlm).resolve())
    unittest.main(module="__main__", argv=[sys.argv[0], *rest], verbosity=2)


def make_model_dir(fixture_dir, dest):
    """`dest` with the fixture checkpoint and the real Qwen3 tokenizer linked in; returns it."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    src = Path(fixture_dir).resolve()
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        (dest / f).symlink_to(src / f)
    (dest / "tokenizer.json").symlink_to(REPO / "tests/data/tokenizer/tokenizer.json")
    return dest


class VlmServer:
    """One `vlm serve` subprocess on a free port; its output goes to a log file. Waits until
    /health answers 200 (or the process dies). `bare`: no options but the port and `extra_args`
    (the tests' name, threads, context and batching defaults left out)."""

    def __init__(self, vlm, model_dir, workdir, name, extra_args=(), ctx=CTX, wait_healthy=True,
                 bare=False):
        self.log_path = Path(workdir) / f"{name}.log"
        self.log = open(self.log_path, "wb")
        model = [] if model_dir is None else ["-m", str(model_dir)]  # None: vlm's default model
        # Small batches by default (many requests queue and join later); extra_args may set them.
        defaults = {"--max-num-seqs": "4", "--max-batched-tokens": "64", "--block-size": "8"}
        batching = [a for k, v in defaults.items() if k not in extra_args for a in (k, v)]
        ours = [] if bare else ["--served-model-name", MODEL, "-t", "2", "-c", str(ctx), *batching]
        cmd = [vlm, "serve", *model, "--port", "0", *ours, *extra_args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        deadline = time.monotonic() + TIMEOUT
        while self.port is None:
            m = re.search(r"serving on http://[^\s:]+:(\d+)", self.log_path.read_text(errors="replace"))
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vlm serve did not start:\n{self.output()}")
            else:
                time.sleep(0.05)
        while wait_healthy:
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vlm serve never answered /health:\n{self.output()}")
            time.sleep(0.05)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def output(self):
        return self.log_path.read_text(errors="replace")[-4000:]

    def status_kb(self, field):
        """A field of /proc/PID/status in KiB (VmRSS, VmHWM)."""
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1))

    def reset_peak_rss(self):
        """Resets the process's peak RSS (VmHWM) to its current RSS; returns that RSS in KiB."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        return self.status_kb("VmRSS")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def metrics(server):
    """{(sample name, sorted label items): value} and {family name: type} of GET /metrics."""
    with urllib.request.urlopen(server.url("/metrics"), timeout=TIMEOUT) as r:
        text = r.read().decode()
    samples, types = {}, {}
    for fam in text_string_to_metric_families(text):
        # The parser drops a counter's _total suffix from the family name; keep the exposed one.
        types[fam.name + "_total" if fam.type == "counter" else fam.name] = fam.type
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
