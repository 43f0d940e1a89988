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

    def __init__(self, slo, base=400.0, slopes=None, cap_after=None, worse=None):
        self.slo, self.base = slo, base
        self.slopes = slopes or {}
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
        mem = setting.get("kv-cache-memory")
        t = tune_serve.Trial(setting, n, "meets" if itl <= self.slo else "misses",
                             1000.0 * n / itl,
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

    def test_other_values_when_the_first_meet_nothing(self):
        # bf16 misses at one sequence (400 + 100 ms > 480); int8 meets up to 3 (400 + 25 x 3).
        curve = Curve(slo=480.0, slopes={"auto": 100.0, "int8": 25.0})
        best = search(curve, space(kv_cache_dtype=["auto", "int8"])).run()
        self.assertEqual((best.setting["kv-cache-dtype"], best.load), ("int8", 3))

    def test_a_plateau_keeps_the_smaller_n(self):
        # Past 4 sequences the throughput grows 1% a sequence: 6 meet the objective (400 + 40 x 6
        # = 640 ms) with 2% more than 4, within the 3% tolerance, so 4 wins; without the
        # tolerance, 6.
        def measure(setting, n):
            t = 4000.0 / 560.0 * (1 + 0.01 * max(0, n - 4)) if n >= 4 else 1000.0 * n / 560.0
            return tune_serve.Trial(setting, n, "meets" if 400 + 40 * n <= 640 else "misses", t,
                                    figures={"kv_reserved_bytes": 8e6})
        self.assertEqual(search(measure).run().load, 4)
        self.assertEqual(search(measure, tolerance=0.0).run().load, 6)

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
        self.assertEqual(s.stopped, "time cap")
        self.assertEqual(best.load, 4)
        self.assertEqual(len(s.trials), 3)

    def test_an_interrupt_keeps_the_best_so_far(self):
        curve = Curve(slo=620.0)

        def measure(setting, n):
            if len(curve.calls) == 2:
                raise KeyboardInterrupt
            return curve(setting, n)
        s = search(measure)
        self.assertEqual(s.run().load, 2)
        self.assertEqual(s.stopped, "interrupted")


class Answer(unittest.TestCase):
    def test_serve_args_become_config_keys(self):
        m = tune_serve.serve_args_mapping(
            "-t 2 --quant int8 --mmap --max-encoder-ms -1 --served-model-name a "
            "--served-model-name b c --ctx=4096 -c 512 --api-key=-x")
        self.assertEqual(m, {"threads": "2", "quant": "int8", "mmap": True, "max-encoder-ms": "-1",
                             "served-model-name": ["a", "b", "c"], "ctx": ["4096", "512"],
                             "api-key": "-x"})
        with self.assertRaises(ValueError):
            tune_serve.serve_args_mapping("-x 1")

    def test_an_earlier_run_read_back(self):
        doc = {"recommended": {"setting": {"kv-cache-dtype": "int8"}, "max_num_seqs": 4},
               "trials": [{"setting": {"kv-cache-dtype": d}, "max_num_seqs": n, "status": st,
                           "reason": "", "throughput": float(n), "figures": {}}
                          for d, n, st in (("auto", 4, "meets"), ("int8", 4, "meets"),
                                           ("int8", 8, "misses"))]}
        trials, best = tune_serve.trials_from_json(doc)
        self.assertEqual([(t.load, t.meets) for t in trials], [(4, True), (4, True), (8, False)])
        self.assertIs(best, trials[1])

    def test_config_values_are_valid_yaml(self):
        for v in ("@org/x", "-", ":x", "true", "no", "a b", "/tmp/dir", 'say "hi"'):
            self.assertEqual(yaml.safe_load(f"k: {tune_serve.yaml_scalar(v)}"), {"k": v})
        self.assertEqual(yaml.safe_load(f"k: {tune_serve.yaml_scalar('-1')}"), {"k": -1})
        self.assertEqual(yaml.safe_load(f"k: {tune_serve.yaml_scalar(True)}"), {"k": True})

    def test_steady_throughput_counts_only_the_full_window(self):
        # Two in flight, six requests of 4 chunks 1 s apart, started at 0, 0.5 (the spread),
        # then each as one ends: the window runs from 0.5 to the last start.
        reqs = []
        starts = [0.0, 0.5, 4.0, 4.5, 8.0, 8.5]
        for s0 in starts:
            reqs.append({"ok": True, "start_s": s0, "chunk_times_s": [0.5, 1.5, 2.5, 3.5],
                         "e2e_s": 4.0, "completion_tokens": 8})
        got = tune_serve.steady_throughput({"requests": reqs}, 2)
        window = (0.5, 8.5)
        tokens = sum(2 * sum(1 for c in r["chunk_times_s"] if window[0] <= r["start_s"] + c
                             < window[1]) for r in reqs)
        self.assertAlmostEqual(got, tokens / 8.0)
        self.assertAlmostEqual(got, 4.0, delta=0.3)  # 2 streams x 2 tokens a second
        self.assertIsNone(tune_serve.steady_throughput({"requests": reqs[:2]}, 2))
        # A first request that ends before the spread is done: the window opens when two are
        # in flight again, not at the second start.
        slow = [dict(r) for r in reqs]
        slow[0]["e2e_s"] = 0.4  # over before request 1 starts at 0.5: two only from 4.0
        slow[0]["chunk_times_s"] = [0.1, 0.2, 0.3, 0.35]
        window = (4.0, 8.5)
        tokens = sum(2 * sum(1 for c in r["chunk_times_s"] if window[0] <= r["start_s"] + c
                             < window[1]) for r in slow)
        self.assertAlmostEqual(tune_serve.steady_throughput({"requests": slow}, 2), tokens / 4.5)


class WholeTuner(unittest.TestCase):
    """`vlm tune` against the fake server: 400 + 75 N ms per token (int8: 400 + 45 N), under
    ITL p99 <= 650 ms: 3 sequences (625 ms; 4: 700), int8 5 (625 ms; 6: 670)."""

    # The fake ignores the model; the real server that reads the config file loads it (the
    # tiny Qwen3.5, whose linear-attention state slots show --max-num-seqs in /metrics).
    model = serve_util.REPO / "models" / "tiny-qwen35"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.work = Path(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def tune(self, name, *extra):
        """`vlm tune` (this Python running the checkout's tuner) with the fake as its server."""
        out = self.work / name
        out.mkdir()
        cmd = [ARGS.vlm, "tune", "--vlm", str(FAKE), "-m", str(self.model),
               "--serve-args", "-t 1 --no-webui", "--no-image", "--output-len", "3",
               "--waves", "2", "--min-requests", "4", "--seqs-max", "8", "--tolerance", "0.05",
               "--slo-itl", "650", "--out-json", str(out / "t.json"), "--out-png", "",
               "--out-config", str(out / "tuned.yaml"), "--server-log-dir", str(out), *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                           env={**os.environ, "VLM_PYTHON": sys.executable})
        return r, out

    def test_the_search_on_servers_it_starts(self):
        r, out = self.tune("search", "--kv-cache-dtype", "auto,int8",
                           "--kv-cache-memory", "auto,1000,2000000")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        doc = json.loads((out / "t.json").read_text())
        rec = doc["recommended"]
        self.assertEqual(rec["max_num_seqs"], 5, r.stdout)
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
            slope = 45.0 if t["setting"]["kv-cache-dtype"] == "int8" else 75.0
            want = 400 + slope * t["max_num_seqs"]
            got = t["figures"]["itl_ms"]["p99"]
            self.assertGreaterEqual(got, want - 5, t)
            self.assertLess(got, want + 80, t)
            self.assertEqual(t["status"], "meets" if got <= 650 else "misses", t)
            # Steady throughput: N streams, each 3 tokens in a 20 ms prefill and two gaps; the
            # window of a 4-request trial spans a request or two, whole chunks counted in it.
            self.assertTrue(t["figures"]["steady_window"], t)
            per_stream = 3 / (0.020 + 2 * want / 1000)
            self.assertAlmostEqual(t["throughput"], t["max_num_seqs"] * per_stream,
                                   delta=0.35 * t["max_num_seqs"] * per_stream)
            self.assertGreater(t["figures"]["rss_peak_bytes"], 1 << 20)
            mem = t["setting"]["kv-cache-memory"]
            self.assertEqual(t["figures"]["kv_reserved_bytes"], 8e6 if mem == "auto" else mem)
        # The server that cannot start is tried down to one sequence (5, 2, 1), each recorded.
        failed = [t for t in trials if t["status"] == "server failed"]
        self.assertEqual([t["max_num_seqs"] for t in failed], [5, 2, 1])
        for t in failed:
            self.assertEqual(t["setting"]["kv-cache-memory"], 1000)
            self.assertIn("cannot hold one sequence", t["reason"])
        self.assertLessEqual(len(trials), 16)
        # The answer: a command line and a config file the real server reads.
        self.assertIn("--max-num-seqs 5 --kv-cache-dtype int8 --kv-cache-memory 2000000",
                      r.stdout)
        conf = yaml.safe_load((out / "tuned.yaml").read_text())
        self.assertEqual(conf, {"model": str(self.model), "threads": 1, "no-webui": True,
                                "max-num-seqs": 5, "kv-cache-dtype": "int8",
                                "kv-cache-memory": 2000000})
        self.assertIn("objective: ITL p99 <= 650 ms", (out / "tuned.yaml").read_text())
        server = serve_util.VlmServer(ARGS.vlm, None, out, "from-config",
                                      ["--config", str(out / "tuned.yaml"), "-c", "256"],
                                      bare=True)
        try:
            samples, _ = serve_util.metrics(server)
        finally:
            server.stop()
        dtypes = [dict(labels).get("cache_dtype") for (name, labels) in samples
                  if name == "vllm:cache_config_info"]
        self.assertEqual(dtypes, ["int8"])
        mem = serve_util.value(samples, "vlm_kv_cache_memory_bytes")
        self.assertTrue(0 < mem <= 2000000, mem)
        # One linear-attention state slot a sequence.
        self.assertEqual(serve_util.value(samples, "vlm_state_slots"), 5.0)

    def test_the_duration_caps_the_search(self):
        r, out = self.tune("capped", "--duration", "4")
        self.assertEqual(r.returncode, 0 if "Recommended" in r.stdout else 3, r.stdout + r.stderr)
        doc = json.loads((out / "t.json").read_text())
        self.assertEqual(doc["stopped"], "time cap")
        self.assertEqual(doc["trials"][-1]["status"], "time cap")
        self.assertIn("--duration cap ended the search" if doc["recommended"]
                      else "the search ended (time cap)", r.stdout)

    def test_bad_requests_are_refused_naming_what(self):
        cases = {
            "no objective": ([], "give an objective"),
            "zero objective": (["--slo-itl", "0"], "positive number"),
            "ITL of one token": (["--slo-itl", "100", "--output-len", "1"], "two tokens"),
            "searched flag in serve args": (["--slo-itl", "100", "--serve-args",
                                             "--max-num-seqs 4"], "sets --max-num-seqs"),
            "model in serve args": (["--slo-itl", "100", "--serve-args=-m x"], "sets --model"),
            "port in serve args": (["--slo-itl", "100", "--serve-args=--port 80"], "free port"),
            "unreadable serve args": (["--slo-itl", "100", "--serve-args", "x"], "cannot read"),
            "bad list": (["--slo-itl", "100", "--kv-cache-memory", "auto,lots"],
                         "--kv-cache-memory"),
            "repeated value": (["--slo-itl", "100", "--kv-cache-dtype", "int8,int8"], "distinct"),
            "percentile": (["--slo-itl", "100", "--slo-percentile", "95"], "invalid choice"),
            "one wave": (["--slo-itl", "100", "--waves", "1"], "--waves must be >= 2"),
        }
        for what, (extra, needle) in cases.items():
            with self.subTest(what):
                cmd = [sys.executable, str(TUNER), "--vlm", str(FAKE), "--model", "M", *extra]
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
    serve_util.run_tests(ARGS, __doc__, model_dir=False)
