"""What vlm says on stderr: --log-level, --log-format (text or JSON lines) and --quiet on the
commands; the load's progress (quantizing, reading the weights, measuring the kernels, a GGUF
file's tensors) redrawn in place on a pseudo-terminal and one plain line per step in a pipe; and
`vlm serve`'s access log: one line per request once answered, with the request id (the
client's X-Request-Id, honoured and sent back, else one made up and sent back), method, path,
status, the generation's prompt / cached / completion tokens (equal to the reply's usage), the
time to the first token and in all, and the client's address."""

import argparse
import fcntl
import json
import os
import pty
import re
import socket
import struct
import subprocess
import tempfile
import termios
import unittest
import urllib.error
import urllib.request
from pathlib import Path

import serve_util

ARGS = argparse.Namespace(vlm=None, model_dir=None)
PROMPT = "Describe the image."


def post(server, path, body, headers=None):
    req = urllib.request.Request(server.url(path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.headers, r.read().decode()


class AccessLog(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.work = Path(cls.tmp.name)
        model = serve_util.make_model_dir(ARGS.model_dir, cls.work / "model")
        cls.server = serve_util.VlmServer(ARGS.vlm, model, cls.work, "json",
                                          extra_args=["--log-format", "json"])

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def lines(self):
        return [json.loads(l) for l in self.server.log_path.read_text().splitlines() if l.strip()]

    def access(self, request_id):
        """The access line of `request_id` (waiting a little: it is written once answered)."""
        for _ in range(100):
            found = [l for l in self.lines() if l["msg"] == "access" and l.get("request_id") == request_id]
            if found:
                serve_util.time.sleep(0.3)  # a second line for the request (e.g. a 499) would be late
                found = [l for l in self.lines()
                         if l["msg"] == "access" and l.get("request_id") == request_id]
                self.assertEqual(len(found), 1, found)
                return found[0]
            serve_util.time.sleep(0.05)
        self.fail(f"no access line for {request_id}: {self.lines()[-5:]}")

    def test_every_line_is_json(self):
        lines = self.lines()  # json.loads of each line passed
        self.assertTrue(lines)
        for l in lines:
            self.assertRegex(l["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
            self.assertIn(l["level"], ("error", "warn", "info", "debug"))
            self.assertIsInstance(l["msg"], str)
        self.assertTrue(any("serving on" in l["msg"] for l in lines))

    def test_a_chat_request_field_by_field(self):
        body = {"model": serve_util.MODEL, "max_tokens": 8,
                "messages": [{"role": "user", "content": "Count the shapes, please."}]}
        headers, text = post(self.server, "/v1/chat/completions", body, {"X-Request-Id": "req-abc.1"})
        self.assertEqual(headers["X-Request-Id"], "req-abc.1")
        usage = json.loads(text)["usage"]
        a = self.access("req-abc.1")
        self.assertEqual((a["level"], a["method"], a["path"], a["status"]),
                         ("info", "POST", "/v1/chat/completions", 200))
        self.assertEqual((a["prompt_tokens"], a["completion_tokens"], a["cached_tokens"]),
                         (usage["prompt_tokens"], usage["completion_tokens"],
                          usage["prompt_tokens_details"]["cached_tokens"]))
        self.assertGreater(a["ttft_ms"], 0)
        self.assertLessEqual(a["ttft_ms"], a["total_ms"])
        self.assertRegex(a["client"], r"^127\.0\.0\.1:\d+$")
        # The same prompt again: the prefix cache's tokens are the log's cached tokens.
        headers, text = post(self.server, "/v1/chat/completions", body, {"X-Request-Id": "req-abc.2"})
        usage = json.loads(text)["usage"]
        a = self.access("req-abc.2")
        self.assertGreater(a["cached_tokens"], 0)
        self.assertEqual(a["cached_tokens"], usage["prompt_tokens_details"]["cached_tokens"])

    def test_several_choices_count_as_the_reply_does(self):
        """n = 2: the reply's usage counts the prompt once; so does the access line."""
        body = {"model": serve_util.MODEL, "max_tokens": 5, "n": 2, "temperature": 1.0, "seed": 3,
                "messages": [{"role": "user", "content": "Two answers, please."}]}
        _, text = post(self.server, "/v1/chat/completions", body, {"X-Request-Id": "two-choices"})
        usage = json.loads(text)["usage"]
        a = self.access("two-choices")
        self.assertEqual((a["prompt_tokens"], a["completion_tokens"], a["cached_tokens"]),
                         (usage["prompt_tokens"], usage["completion_tokens"],
                          usage["prompt_tokens_details"]["cached_tokens"]))

    def test_bytes_that_are_not_utf8_keep_lines_json(self):
        """A request line with a raw 0xFF byte (the transport's 404): its access line is valid
        JSON, the byte as U+FFFD."""
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=30) as s:
            s.sendall(b"GET /caf\xff HTTP/1.1\r\nHost: x\r\nX-Request-Id: raw-bytes\r\n"
                      b"Connection: close\r\n\r\n")
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        self.assertTrue(reply.startswith(b"HTTP/1.1 404"), reply[:100])
        a = self.access("raw-bytes")
        self.assertEqual(a["path"], "/caf\ufffd")

    def test_streamed_request_and_a_made_up_id(self):
        body = {"model": serve_util.MODEL, "max_tokens": 6, "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "Hello there"}]}
        headers, text = post(self.server, "/v1/chat/completions", body)
        rid = headers["X-Request-Id"]
        self.assertRegex(rid, r"^[0-9a-f]{16}$")
        events = [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: {")]
        usage = [e["usage"] for e in events if e.get("usage")][-1]
        a = self.access(rid)
        self.assertEqual((a["status"], a["prompt_tokens"], a["completion_tokens"]),
                         (200, usage["prompt_tokens"], usage["completion_tokens"]))

    def test_refusals_are_logged_too(self):
        """A route that does not exist (the transport's own 404), and an id that is not printable
        (replaced by a made-up one)."""
        req = urllib.request.Request(self.server.url("/no/such/route"), headers={"X-Request-Id": "a b"})
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        rid = e.exception.headers["X-Request-Id"]
        self.assertRegex(rid, r"^[0-9a-f]{16}$")
        a = self.access(rid)
        self.assertEqual((a["method"], a["path"], a["status"]), ("GET", "/no/such/route", 404))
        self.assertNotIn("prompt_tokens", a)


class CommandLogs(unittest.TestCase):

    def run_vlm(self, *args):
        return subprocess.run([ARGS.vlm, "run", "-p", PROMPT, "--greedy", "-n", "8", "-t", "2", *args],
                              capture_output=True, text=True, timeout=120)

    def test_levels(self):
        """info (default) says the load notes and the summary line; warn and error say nothing
        on a run that goes well; the reply on stdout is the same at every level."""
        info = self.run_vlm()
        self.assertEqual(info.returncode, 0, info.stderr)
        self.assertRegex(info.stderr, r"(?m)^vlm: .*prompt \d+ tokens")
        for level in ("warn", "error"):
            r = self.run_vlm("--log-level", level)
            self.assertEqual((r.returncode, r.stderr, r.stdout), (0, "", info.stdout))

    def test_json_format(self):
        r = self.run_vlm("--log-format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [json.loads(l) for l in r.stderr.splitlines()]
        self.assertTrue(any(re.search(r"prompt \d+ tokens", l["msg"]) for l in lines))
        bad = subprocess.run([ARGS.vlm, "run", "-m", "/nonexistent", "-p", "x", "--log-format", "json"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 1)
        (err,) = [json.loads(l) for l in bad.stderr.splitlines()]
        self.assertEqual(err["level"], "error")
        self.assertIn("/nonexistent", err["msg"])

    def test_bad_values_are_refused(self):
        for flag, value, needle in (("--log-level", "loud", "error, warn, info or debug"),
                                    ("--log-format", "xml", "text or json")):
            r = self.run_vlm(flag, value)
            self.assertEqual(r.returncode, 1)
            self.assertIn(needle, r.stderr)


def on_terminal(cmd, env, cols=100):
    """`cmd` with stderr a pseudo-terminal `cols` wide: (exit code, stdout, the bytes it was sent
    as written, \\n not turned into \\r\\n)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its side
            break
        if not chunk:
            break
        err += chunk
    out = p.stdout.read()
    p.stdout.close()
    p.wait(timeout=120)
    os.close(master)
    return p.returncode, out.decode(), err.decode()


class LoadProgress(unittest.TestCase):
    """The steps of a load: int8 quantization, the huge-page copy and the kernels' measurement
    (an empty kernel cache makes it measure) on the tiny checkpoint, and a GGUF file's tensors."""

    STEPS = [r"quantizing the text decoder to int8: 1 layer in \d+\.\d s",
             r"reading the weights: [\d.]+ KiB in \d+\.\d s( \([\d.]+ [KMG]iB/s\))?",
             r"measuring the int8_decode kernels: \d+ runs in \d+\.\d s"]

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.work = Path(cls.tmp.name)
        cls.model = serve_util.make_model_dir(ARGS.model_dir, cls.work / "model")
        cls.gguf = serve_util.REPO / "tests/model/fixtures/gguf"

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def cmd(self, *extra):
        return [ARGS.vlm, "run", "-m", str(self.model), "--quant", "int8", "-p", PROMPT, "--greedy",
                "-n", "4", "-t", "2", *extra]

    def env(self, term="xterm"):
        cache = tempfile.mkdtemp(dir=self.work)  # no kernel choice cached: measured
        env = {**os.environ, "VLM_CACHE_DIR": cache, "TERM": term}
        env.pop("VLM_CPU_KERNELS", None)  # (ctest's choice, which skips the measurement)
        return env

    def test_a_pipe_gets_one_plain_line_per_step(self):
        r = subprocess.run(self.cmd(), capture_output=True, text=True, env=self.env(), timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("\r", r.stderr)
        self.assertNotIn("\x1b", r.stderr)
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), len(self.STEPS) + 1, r.stderr)  # and the summary line
        for line, step in zip(lines, self.STEPS):
            self.assertRegex(line, "^vlm: " + step + "$")
        self.assertRegex(lines[-1], r"^vlm: prompt \d+ tokens")

    def test_a_terminal_gets_each_step_redrawn_in_place(self):
        piped = subprocess.run(self.cmd(), capture_output=True, text=True, env=self.env(), timeout=120)
        rc, out, err = on_terminal(self.cmd(), self.env())
        self.assertEqual((rc, out), (0, piped.stdout), err)
        # Each step: its first frame at once (0 of N, an empty bar), maybe more frames, then
        # replaced by the plain line a pipe gets; the summary after.
        first = [r"quantizing the text decoder to int8 \[ {20}\] 0/1 layers, 0\.0 s",
                 r"reading the weights \[ {20}\] 0 B / [\d.]+ KiB, 0\.0 s",
                 r"measuring the int8_decode kernels \[ {20}\] 0/\d+ runs, 0\.0 s"]
        frame = r"\r\x1b\[Kvlm: [^\r\n]*\[[# ]{20}\][^\r\n]*"
        pattern = "".join(rf"\r\x1b\[Kvlm: {f}({frame})*\r\x1b\[Kvlm: {s}\n"
                          for f, s in zip(first, self.STEPS))
        self.assertRegex(err, "^" + pattern + r"vlm: prompt \d+ tokens[^\n]*\n$")
        # The measurement's frames count up to the end: a bar that fills.
        runs = [int(m) for m in re.findall(r"measuring the int8_decode kernels \[[# ]+\] (\d+)/", err)]
        self.assertEqual(runs, sorted(runs))
        self.assertGreaterEqual(len(runs), 2)
        # One row wide on a narrow terminal (a wrapped line could not be redrawn).
        _, _, narrow = on_terminal(self.cmd(), self.env(), cols=30)
        for f in re.findall(r"\r\x1b\[K([^\r\n]*)(?=\r)", narrow):
            self.assertLess(len(f), 30, f)

    def test_quiet_and_a_dumb_terminal(self):
        piped = subprocess.run(self.cmd(), capture_output=True, text=True, env=self.env(), timeout=120)
        for flag in ("-q", "--quiet"):
            r = subprocess.run(self.cmd(flag), capture_output=True, text=True, env=self.env(),
                               timeout=120)
            self.assertEqual((r.returncode, r.stderr, r.stdout), (0, "", piped.stdout))
            rc, out, err = on_terminal(self.cmd(flag), self.env())
            self.assertEqual((rc, err, out), (0, "", piped.stdout))
        for sub in (["tokenize", "-m", str(self.model), "--text", "hi"], ["ls"]):
            r = subprocess.run([ARGS.vlm, *sub, "-q"], capture_output=True, text=True,
                               env={**os.environ, "HF_HUB_CACHE": str(self.work / "hub")},
                               timeout=60)
            self.assertEqual((r.returncode, r.stderr), (0, ""), sub)
        rc, _, err = on_terminal(self.cmd(), self.env(term="dumb"))
        self.assertEqual(rc, 0, err)
        self.assertNotIn("\x1b", err)
        for line, step in zip(err.splitlines(), self.STEPS):
            self.assertRegex(line, "^vlm: " + step + "$")

    def test_json_lines_carry_the_counts(self):
        r = subprocess.run(self.cmd("--log-format", "json"), capture_output=True, text=True,
                           env=self.env(), timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        steps = [l for l in map(json.loads, r.stderr.splitlines()) if "unit" in l]
        self.assertEqual([s["msg"] for s in steps],
                         ["quantizing the text decoder to int8", "reading the weights",
                          "measuring the int8_decode kernels"])
        self.assertEqual([s["unit"] for s in steps], ["layers", "bytes", "runs"])
        for s in steps:
            self.assertEqual(s["done"], s["total"])
            self.assertGreater(s["total"], 0)
            self.assertGreaterEqual(s["seconds"], 0)

    def test_a_failed_step_takes_its_line_back(self):
        # INT4 in groups of 32 cannot quantize the tiny model's 16-wide weights.
        cmd = self.cmd()
        cmd[cmd.index("int8")] = "int4"
        rc, _, err = on_terminal(cmd, self.env())
        self.assertEqual(rc, 1)
        self.assertRegex(err, r"^\r\x1b\[Kvlm: quantizing the text decoder to int4 \[ +\] 0/1 layers, "
                              r"0\.0 s(\r\x1b\[K[^\r\n]*)*\r\x1b\[Kvlm: error: quantizing the text "
                              r"decoder to int4 [^\r]*multiple of 32[^\r]*\n$")

    def test_a_gguf_files_tensors(self):
        r = subprocess.run([ARGS.vlm, "run", "-m", str(self.gguf / "vision-f32.gguf"), "--mmproj",
                            str(self.gguf / "vision-f32-mmproj.gguf"), "-p", PROMPT, "-n", "2",
                            "--no-autotune"], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stderr.splitlines()
        self.assertRegex(lines[0], r"^vlm: loading the GGUF text decoder: 4 layers in \d+\.\d s$")
        self.assertRegex(lines[1], r"^vlm: loading the GGUF vision tower: 4 blocks in \d+\.\d s$")
        self.assertRegex(lines[2], r"^vlm: reading the weights: [\d.]+ MiB in ")


if __name__ == "__main__":
    serve_util.run_tests(ARGS, __doc__)
