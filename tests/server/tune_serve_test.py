"""scripts/tune_serve.py, the serving tuner: its search against known latency curves, and the
whole tuner (servers started and stopped, trials measured, the answer as a command line and a
`vlm serve --config` file) against fake_vlm_serve.py, a stand-in server whose inter-token latency
at N requests in flight is known; the config file it writes is then read by the real
`vlm serve --config`."""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest
import urllib.request
from pathlib import Path

import serve_util
import yaml

sys.path.insert(0, str(serve_util.REPO / "scripts"))
import tune_serve  # noqa: E402

ARGS = argparse.Namespace(vlm=None, model_dir=None)
HERE = Path(__file__).resolve().parent
FAKE = HERE / "fake_vlm_serve.py"
TUNER = serve_util.REPO / "scripts" / "tune_serve.py"


class Curve:
    """A server whose inter-token latency at n in flight is base + slope[dtype] n ms, with the
    throughput n / itl, and KV bytes by its kv-cache-memory; counts what it was asked."""

    def __init__(self, slo, base=400.0, slopes=None, flat_from=None, cap_after=None,
                 worse=None):
        self.slo, self.base = slo, base
        self.slopes = slopes or {}
        self.flat_from = flat_from  # throughput stops growing past this n
        self.cap_after = cap_after  # TimeCap on this many-th trial
        self.worse = worse or {}  # dimension -> value that doubles the latency
        self.calls = []

    def itl(self, setting, n):
        itl = self.base + self.slopes.get(setting.get("kv-cache-dtype"), 40.0) * n
        for dim, v in self.worse.items():
            if setting.get(dim) == v:
                itl *= 2
        return itl

    def __call__(self, setting, n):
        self.calls.append((dict(setting), n))
        if self.cap_after is not None and len(self.calls) >= self.cap_after:
            raise tune_serve.TimeCap()
        itl = self.itl(setting, n)
        eff = n if self.flat_from is None else min(n, self.flat_from)
        mem = setting.get("kv-cache-memory")
        t = tune_serve.Trial(setting, n, "meets" if itl <= self.slo else "misses",
                             1000.0 * eff / itl,
                             figures={"kv_reserved_bytes": 8e6 if mem == "auto" else mem})
        return t


def space(**dims):
    out = {d: ["auto"] for d in tune_serve.DIMENSIONS}
    out.update({k.replace("_", "-"): v for k, v in dims.items()})
    return out


def search(curve, sp=None, seqs_max=64, start=1, tolerance=0.03):
    return tune_serve.Search(curve, sp or space(), 1, seqs_max, start, tolerance)


class SearchLogic(unittest.TestCase):
    """The search alone, with an instant fake measurement."""

    def test_bisection_finds_the_largest_n_within_the_objective(self):
        for slo in range(440, 3000, 37):
            for start in (1, 3, 16):
                with self.subTest(slo=slo, start=start):
                    curve = Curve(slo)
                    s = search(curve, start=start, tolerance=0.0)
                    best = s.run()
                    edge = min(64, math.floor((slo - 400) / 40))
                    self.assertEqual(best.load, edge)
                    self.assertTrue(best.meets)
                    asked = [n for _, n in curve.calls]
                    self.assertEqual(len(asked), len(set(asked)), asked)  # never twice
                    self.assertLessEqual(len(asked), 2 * math.ceil(math.log2(64)) + 2, asked)

    def test_an_objective_nothing_meets(self):
        curve = Curve(slo=430.0)  # n = 1 already takes 440 ms
        s = search(curve)
        self.assertIsNone(s.run())
        self.assertEqual([n for _, n in curve.calls], [1])

    def test_a_plateau_keeps_the_smaller_n(self):
        # Throughput stops growing past 4 sequences; 9 still meet the objective.
        best = search(Curve(slo=800.0, flat_from=4)).run()
        self.assertEqual(best.load, 4)

    def test_each_dimension_in_turn(self):
        curve = Curve(slo=620.0, slopes={"int8": 25.0},
                      worse={"max-batched-tokens": 64})
        sp = space(max_batched_tokens=["auto", 64], kv_cache_dtype=["auto", "int8"],
                   kv_cache_memory=["auto", 2_000_000])
        s = search(curve, sp, seqs_max=32)
        best = s.run()
        # int8 runs 8 sequences within 620 ms (400 + 25 x 8) against 5 at bf16 (400 + 40 x 5);
        # 2 MB of KV cache does as well as the default 8 MB, so the smaller wins.
        self.assertEqual(best.load, 8)
        self.assertEqual(best.setting, {"max-batched-tokens": "auto", "max-encoder-ms": "auto",
                                        "kv-cache-dtype": "int8", "kv-cache-memory": 2_000_000})
        # The token budget that doubles the latency missed at its first trial, with less
        # throughput than the best: dropped there.
        self.assertEqual(sum(1 for st, _ in curve.calls if st["max-batched-tokens"] == 64), 1)

    def test_the_time_cap_keeps_the_best_so_far(self):
        curve = Curve(slo=620.0, cap_after=4)  # trials at 1, 2, 4, then the cap
        s = search(curve)
        best = s.run()
        self.assertTrue(s.capped)
        self.assertEqual(best.load, 4)
        self.assertEqual(len(s.trials), 3)


class Answer(unittest.TestCase):
    def test_serve_args_become_config_keys(self):
        m = tune_serve.serve_args_mapping(
            "-t 2 --quant int8 --mmap --max-encoder-ms -1 --served-model-name a "
            "--served-model-name b --ctx=4096 -c 512")
        self.assertEqual(m, {"threads": "2", "quant": "int8", "mmap": True, "max-encoder-ms": "-1",
                             "served-model-name": ["a", "b"], "ctx": ["4096", "512"]})
        with self.assertRaises(SystemExit):
            tune_serve.serve_args_mapping("-x 1")


class WholeTuner(unittest.TestCase):
    """tune_serve.py against the fake server: 400 + 40 N ms per token (int8: 400 + 25 N)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.work = Path(cls.tmp.name)
        cls.model = serve_util.make_model_dir(ARGS.model_dir, cls.work / "model")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def tune(self, name, *extra):
        """`vlm tune` (this Python running the checkout's tuner) with the fake as its server."""
        out = self.work / name
        out.mkdir()
        cmd = [ARGS.vlm, "tune", "--vlm", str(FAKE), "-m", str(self.model),
               "--serve-args", "-t 1 --no-webui", "--no-image", "--output-len", "3",
               "--waves", "2", "--min-requests", "4", "--seqs-max", "12", "--tolerance", "0.05",
               "--slo-itl", "620", "--out-json", str(out / "t.json"), "--out-png", "",
               "--out-config", str(out / "tuned.yaml"), "--server-log-dir", str(out), *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "VLM_PYTHON": sys.executable})
        return r, out

    def test_the_search_on_servers_it_starts(self):
        r, out = self.tune("search", "--kv-cache-dtype", "auto,int8",
                           "--kv-cache-memory", "auto,1000,2000000")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        doc = json.loads((out / "t.json").read_text())
        rec = doc["recommended"]
        self.assertEqual(rec["max_num_seqs"], 8, r.stdout)
        self.assertEqual(rec["setting"]["kv-cache-dtype"], "int8")
        self.assertEqual(rec["setting"]["kv-cache-memory"], 2000000)
        trials = doc["trials"]
        seen = set()
        for t in trials:
            key = (json.dumps(t["setting"], sort_keys=True), t["max_num_seqs"])
            self.assertNotIn(key, seen)
            seen.add(key)
            if t["status"] == "server failed":
                continue
            # The measured latency is the server's: all N run at once.
            slope = 25.0 if t["setting"]["kv-cache-dtype"] == "int8" else 40.0
            want = 400 + slope * t["max_num_seqs"]
            got = t["figures"]["itl_ms"]["p99"]
            self.assertGreaterEqual(got, want - 5, t)
            self.assertLess(got, want + 80, t)
            self.assertEqual(t["status"], "meets" if got <= 620 else "misses", t)
            self.assertGreater(t["figures"]["rss_peak_bytes"], 1 << 20)
            mem = t["setting"]["kv-cache-memory"]
            self.assertEqual(t["figures"]["kv_reserved_bytes"], 8e6 if mem == "auto" else mem)
        failed = [t for t in trials if t["status"] == "server failed"]
        self.assertEqual(len(failed), 1)
        self.assertEqual(failed[0]["setting"]["kv-cache-memory"], 1000)
        self.assertIn("cannot hold one sequence", failed[0]["reason"])
        self.assertLessEqual(len(trials), 18)
        # The answer: a command line and a config file the real server reads.
        self.assertIn("--max-num-seqs 8 --kv-cache-dtype int8 --kv-cache-memory 2000000",
                      r.stdout)
        conf = yaml.safe_load((out / "tuned.yaml").read_text())
        self.assertEqual(conf, {"model": str(self.model), "threads": 1, "no-webui": True,
                                "max-num-seqs": 8, "kv-cache-dtype": "int8",
                                "kv-cache-memory": 2000000})
        server = serve_util.VlmServer(ARGS.vlm, None, self.work, "from-config",
                                      ["--config", str(out / "tuned.yaml")])
        try:
            with urllib.request.urlopen(server.url("/metrics"), timeout=30) as resp:
                text = resp.read().decode()
            self.assertIn('cache_dtype="int8"', text)
            mem = [float(x.split()[1]) for x in text.splitlines()
                   if x.startswith("vlm_kv_cache_memory_bytes ")]
            self.assertTrue(mem and 0 < mem[0] <= 2000000, mem)
        finally:
            server.stop()

    def test_the_duration_caps_the_search(self):
        r, out = self.tune("capped", "--duration", "4")
        self.assertIn(r.returncode, (0, 2), r.stdout + r.stderr)
        doc = json.loads((out / "t.json").read_text())
        self.assertTrue(doc["capped"])
        self.assertEqual(doc["trials"][-1]["status"], "time cap")
        self.assertIn("--duration cap ended the search", r.stdout)

    def test_bad_requests_are_refused_naming_what(self):
        cases = {
            "no objective": (["--slo-itl", "0"], "positive number"),
            "searched flag in serve args": (["--serve-args", "--max-num-seqs 4"],
                                            "--serve-args sets --max-num-seqs"),
            "bad list": (["--kv-cache-memory", "auto,lots"], "--kv-cache-memory"),
            "repeated value": (["--kv-cache-dtype", "int8,int8"], "distinct"),
        }
        for what, (extra, needle) in cases.items():
            with self.subTest(what):
                cmd = [sys.executable, str(TUNER), "--vlm", str(FAKE), "--model", "M",
                       "--slo-itl", "100", *extra]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(needle, r.stderr)

    def test_vlm_tune_without_its_python(self):
        r = subprocess.run([ARGS.vlm, "tune", "--help"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "VLM_PYTHON": "/nonexistent/python"})
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot run /nonexistent/python", r.stderr)
        self.assertIn("requirements-bench.txt", r.stderr)
        r = subprocess.run([ARGS.vlm, "tune", "--help"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "VLM_PYTHON": sys.executable})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--slo-itl", r.stdout)


if __name__ == "__main__":
    serve_util.run_tests(ARGS, __doc__)
