#!/usr/bin/env python3
"""The front door of `vlm serve` against hostile and careless clients, over loopback sockets.

Every case checks the status the client gets, and afterwards (tearDown) that the server is alive
and still answers a normal request. Memory is read from /proc (VmRSS, and VmHWM reset through
clear_refs before an attack), so "peak RSS rises by less than 64 MiB" is measured on the server
process itself. Registered with CTest by tests/CMakeLists.txt (label `server`):

  python3 tests/server/front_door_test.py --vlm BUILD/tools/cli/vlm \\
      --model-dir tests/model/fixtures/tiny-fullvocab-bf16 [unittest args]
"""

import argparse
import concurrent.futures
import gzip
import json
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import zlib
from pathlib import Path

import serve_util
from serve_util import MODEL, REPO, TIMEOUT, VlmServer, value

ARGS = argparse.Namespace(vlm=None, model_dir=None)
KEY = "front-door-key"
MIB = 1 << 20


def chat_body(text="Hello there.", max_tokens=4, **extra):
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}],
                       "max_tokens": max_tokens, "temperature": 0, **extra}).encode()


def connect(port, timeout=TIMEOUT):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(sock, timeout=TIMEOUT):
    """(status, headers {lower name: value}, body) of one HTTP/1.1 response; the body by
    Content-Length, chunked framing or EOF. (0, {}, b"") when the connection closed first."""
    sock.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        try:
            d = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            d = b""
        if not d:
            return 0, {}, buf
        buf += d
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, v = line.split(":", 1)
        headers[k.strip().lower()] = v.strip()

    def more():
        try:
            return sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            return b""

    if status == 100:  # an interim answer: the caller reads the next one
        return status, headers, rest
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            d = more()
            if not d:
                break
            rest += d
        return status, headers, rest[:n]
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            while b"\r\n" not in rest:
                d = more()
                if not d:
                    return status, headers, body
                rest += d
            size_line, rest = rest.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(rest) < size + 2:
                d = more()
                if not d:
                    return status, headers, body + rest
                rest += d
            body += rest[:size]
            rest = rest[size + 2:]
            if size == 0:
                return status, headers, body
    while True:
        d = more()
        if not d:
            return status, headers, rest
        rest += d


def request_bytes(method, path, headers=(), body=b"", content_length=True):
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += list(headers)
    if content_length and body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def closed_by_peer(sock, within):
    """True when the server closes `sock` (EOF or reset) within `within` seconds."""
    sock.settimeout(within)
    try:
        while True:
            d = sock.recv(4096)
            if not d:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


class FrontDoorTest(unittest.TestCase):
    """One server with --api-key and default transport limits, shared by the cases."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="vlm_front_door_test_"))
        cls.model_dir = serve_util.make_model_dir(ARGS.model_dir, cls.tmp / "model")
        cls.server = cls.start("main", ["--api-key", KEY, "--max-num-seqs", "16",
                                        "--max-batched-tokens", "128", "--header-timeout", "4"])

    @classmethod
    def start(cls, name, args, **kw):
        return VlmServer(ARGS.vlm, cls.model_dir, cls.tmp, name, args, **kw)

    @classmethod
    def tearDownClass(cls):
        alive = cls.server.proc.poll() is None
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if not alive:
            raise AssertionError(f"vlm serve exited during the tests:\n{cls.server.output()}")

    def tearDown(self):
        # Whatever the case did, the server is alive and a normal request succeeds.
        self.assertIsNone(self.server.proc.poll(), self.server.output())
        self.assertEqual(self.health(self.server)[0], 200)
        status, _, body = self.send(self.server, "POST", "/v1/chat/completions", chat_body(), key=KEY)
        self.assertEqual(status, 200, body)

    # ----- helpers -----

    def send(self, server, method, path, body=b"", key=None, headers=(), timeout=TIMEOUT):
        h = list(headers)
        if key:
            h.append(f"Authorization: Bearer {key}")
        if body:
            h.append("Content-Type: application/json")
        with connect(server.port, timeout) as s:
            s.sendall(request_bytes(method, path, h, body))
            return read_response(s, timeout)

    def health(self, server, timeout=TIMEOUT):
        """(status, seconds) of GET /health on a new connection."""
        t0 = time.monotonic()
        status, _, _ = self.send(server, "GET", "/health", timeout=timeout)
        return status, time.monotonic() - t0

    def metric(self, server, name, **labels):
        return value(serve_util.metrics(server)[0], name, **labels)

    def wait_for(self, what, fn, timeout=20.0):
        deadline = time.monotonic() + timeout
        while True:
            v = fn()
            if v:
                return v
            if time.monotonic() > deadline:
                self.fail(f"timed out waiting for {what}")
            time.sleep(0.05)

    def attack_memory(self, send_body, header_lines, expect_status):
        """Sends a header and then a body from `send_body(sock)` on another thread, while reading
        the answer; returns (status, body, peak RSS rise in MiB)."""
        base_kb = self.server.reset_peak_rss()
        with connect(self.server.port) as s:
            s.sendall(("\r\n".join(["POST /v1/chat/completions HTTP/1.1", "Host: 127.0.0.1",
                                    *header_lines]) + "\r\n\r\n").encode())
            sender = threading.Thread(target=send_body, args=(s,), daemon=True)
            sender.start()
            status, headers, body = read_response(s)
            sender.join(timeout=30)
        rise = (self.server.status_kb("VmHWM") - base_kb) / 1024
        self.assertEqual(status, expect_status, body)
        self.assertEqual(headers.get("connection", "").lower(), "close")
        return status, body, rise

    # ----- bodies: limits before and after decoding -----

    def test_gzip_bomb_without_key_is_401_before_inflating(self):
        bomb = gzip.compress(b"\0" * (1 << 30), 9)  # 1 MiB that inflates to 1 GiB
        self.assertLess(len(bomb), 2 * MIB)

        def send(s):
            try:
                s.sendall(bomb)
            except OSError:
                pass

        _, body, rise = self.attack_memory(
            send, ["Content-Encoding: gzip", f"Content-Length: {len(bomb)}"], 401)
        self.assertIn(b"API key", body)
        self.assertLess(rise, 64, f"peak RSS rose by {rise:.1f} MiB")

    def test_gzip_bomb_with_key_is_413_with_bounded_memory(self):
        bomb = gzip.compress(b"\0" * (1 << 30), 9)

        def send(s):
            try:
                s.sendall(bomb)
            except OSError:
                pass

        _, body, rise = self.attack_memory(
            send, [f"Authorization: Bearer {KEY}", "Content-Encoding: gzip",
                   f"Content-Length: {len(bomb)}"], 413)
        self.assertIn(b"decoded from gzip", body)
        self.assertLess(rise, 64, f"peak RSS rose by {rise:.1f} MiB")

    def chunked_sender(self, total):
        chunk = b"x" * MIB
        piece = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"

        def send(s):
            try:
                for _ in range(total // MIB):
                    s.sendall(piece)
                s.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the server closed after its answer: expected
        return send

    def test_chunked_bodies_of_64_and_200_mib_are_413_with_bounded_memory(self):
        for mib in (64, 200):
            with self.subTest(mib=mib):
                _, _, rise = self.attack_memory(
                    self.chunked_sender(mib * MIB),
                    [f"Authorization: Bearer {KEY}", "Transfer-Encoding: chunked"], 413)
                self.assertLess(rise, 64, f"{mib} MiB chunked: peak RSS rose by {rise:.1f} MiB")
        _, _, rise = self.attack_memory(self.chunked_sender(200 * MIB),
                                        ["Transfer-Encoding: chunked"], 401)
        self.assertLess(rise, 64, f"without a key: peak RSS rose by {rise:.1f} MiB")

    def test_content_length_is_digits_only_and_one_value(self):
        body = chat_body()
        for cl in ("1e3", "+%d" % len(body), "0x10", "-1", "%d, %d" % (len(body), len(body)), " "):
            with self.subTest(content_length=cl):
                with connect(self.server.port) as s:
                    s.sendall(request_bytes("POST", "/v1/chat/completions",
                                            [f"Authorization: Bearer {KEY}", f"Content-Length: {cl}"],
                                            body, content_length=False))
                    status, _, resp = read_response(s)
                self.assertEqual(status, 400, resp)
        with connect(self.server.port) as s:  # the same value twice
            s.sendall(request_bytes("POST", "/v1/chat/completions",
                                    [f"Authorization: Bearer {KEY}", f"Content-Length: {len(body)}"], body))
            status, _, resp = read_response(s)
        self.assertEqual(status, 400, resp)
        self.assertIn(b"more than one Content-Length", resp)

    def test_encodings(self):
        body = chat_body()
        for name, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body)),
                           ("identity", body)):
            with self.subTest(encoding=name):
                status, _, resp = self.send(self.server, "POST", "/v1/chat/completions", data, key=KEY,
                                            headers=[f"Content-Encoding: {name}"])
                self.assertEqual(status, 200, resp)
        status, _, resp = self.send(self.server, "POST", "/v1/chat/completions", body, key=KEY,
                                    headers=["Content-Encoding: zstd"])
        self.assertEqual(status, 415, resp)
        status, _, resp = self.send(self.server, "POST", "/v1/chat/completions", b"not gzip at all", key=KEY,
                                    headers=["Content-Encoding: gzip"])
        self.assertEqual(status, 400, resp)
        status, _, resp = self.send(self.server, "POST", "/v1/chat/completions", gzip.compress(body)[:-12],
                                    key=KEY, headers=["Content-Encoding: gzip"])
        self.assertEqual(status, 400, resp)
        with connect(self.server.port) as s:
            s.sendall(request_bytes("POST", "/v1/chat/completions",
                                    [f"Authorization: Bearer {KEY}", "Transfer-Encoding: gzip, chunked"],
                                    b"0\r\n\r\n", content_length=False))
            status, _, resp = read_response(s)
        self.assertEqual(status, 501, resp)

    def test_header_size_and_field_count_limits(self):
        status, _, _ = self.send(self.server, "GET", "/health", headers=["X-Big: " + "a" * (20 << 10)])
        self.assertEqual(status, 431)
        status, _, _ = self.send(self.server, "GET", "/health",
                                 headers=[f"X-Field-{i}: {i}" for i in range(150)])
        self.assertEqual(status, 431)
        status, _, _ = self.send(self.server, "GET", "/health", headers=[f"X-Field-{i}: {i}" for i in range(50)])
        self.assertEqual(status, 200)

    def test_expect_100_continue_only_after_the_header_passes(self):
        body = chat_body()
        with connect(self.server.port) as s:
            s.sendall(request_bytes("POST", "/v1/chat/completions",
                                    [f"Authorization: Bearer {KEY}", "Expect: 100-continue"], None)
                      .replace(b"\r\n\r\n", f"\r\nContent-Length: {len(body)}\r\n\r\n".encode()))
            status, _, rest = read_response(s)
            self.assertEqual(status, 100)
            s.sendall(body)
            status, _, resp = read_response(s)
            self.assertEqual(status, 200, resp)
        with connect(self.server.port) as s:  # no key: the final answer at once, no 100
            s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n".encode())
            status, _, _ = read_response(s)
            self.assertEqual(status, 401)

    def test_unknown_route_and_method(self):
        self.assertEqual(self.send(self.server, "GET", "/nope")[0], 404)
        status, headers, _ = self.send(self.server, "DELETE", "/v1/chat/completions", key=KEY)
        self.assertEqual(status, 405)
        self.assertEqual(headers.get("allow"), "POST")
        # The key is compared as a whole (constant time): a prefix or a longer string is wrong.
        for wrong in (KEY[:-1], KEY + "x", "", KEY.upper()):
            self.assertEqual(self.send(self.server, "GET", "/v1/models", key=wrong or None)[0], 401)
        self.assertEqual(self.send(self.server, "GET", "/v1/models", key=KEY)[0], 200)

    # ----- many clients: idle, slow and busy at once -----

    def test_health_answers_within_a_second_under_idle_slow_and_busy_clients(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
        idle, slow = [], []
        pool = concurrent.futures.ThreadPoolExecutor(16)
        try:
            # 16 long non-streaming generations.
            body = chat_body("Tell me everything.", 440, ignore_eos=True)
            gens = [pool.submit(self.send, self.server, "POST", "/v1/chat/completions", body, KEY)
                    for _ in range(16)]
            # 500 idle keep-alive connections (each answered once, then silent).
            for _ in range(500):
                s = connect(self.server.port)
                s.sendall(request_bytes("GET", "/health"))
                self.assertEqual(read_response(s)[0], 200)
                idle.append(s)
            # 20 clients that send a header one byte at a time.
            for _ in range(20):
                s = connect(self.server.port)
                s.sendall(b"P")
                slow.append(s)
            self.wait_for("16 running generations",
                          lambda: self.metric(self.server, "vlm_num_requests_running") >= 16, 30)
            self.assertGreaterEqual(self.metric(self.server, "vlm_http_connections_open"), 520)
            times = []
            for i in range(8):
                for s in slow:
                    try:
                        s.sendall(b"OST /v1/chat/completions HTTP/1.1\r\n"[i:i + 1])
                    except OSError:
                        pass
                status, seconds = self.health(self.server)
                self.assertEqual(status, 200)
                times.append(seconds)
                time.sleep(0.25)
            self.assertLess(max(times), 1.0, f"/health took {times}")
            self.assertGreaterEqual(self.metric(self.server, "vlm_num_requests_running"), 1,
                                    "the generations ended before /health was probed")
            # The slow clients are cut off at the header timeout (4 s here); the idle ones stay.
            for s in slow:
                self.assertTrue(closed_by_peer(s, 8), "a slow header was not timed out")
            for s in idle[:5]:
                s.sendall(request_bytes("GET", "/health"))
                self.assertEqual(read_response(s)[0], 200)
            for g in gens:
                status, _, resp = g.result(timeout=120)
                self.assertEqual(status, 200, resp)
                self.assertEqual(json.loads(resp)["usage"]["completion_tokens"], 440)
        finally:
            for s in idle + slow:
                s.close()
            pool.shutdown(wait=True)

    # ----- disconnects cancel -----

    def test_non_streaming_disconnect_cancels_and_frees_kv(self):
        m0 = serve_util.metrics(self.server)[0]
        cancelled0 = value(m0, "vlm_requests_total", outcome="cancelled")
        generated0 = value(m0, "vlm_generation_tokens_total")
        s = connect(self.server.port)
        s.sendall(request_bytes("POST", "/v1/chat/completions", [f"Authorization: Bearer {KEY}"],
                                chat_body("Keep talking.", 440, ignore_eos=True)))
        self.wait_for("the request to hold KV blocks",
                      lambda: self.metric(self.server, "vlm_kv_cache_blocks_used") > 0)
        s.close()
        t0 = time.monotonic()

        def freed():
            m = serve_util.metrics(self.server)[0]
            return (value(m, "vlm_kv_cache_blocks_used") == 0 and value(m, "vlm_num_requests_running") == 0
                    and value(m, "vlm_requests_total", outcome="cancelled") == cancelled0 + 1) and m
        m = self.wait_for("the cancelled request's KV blocks back", freed, 10)
        print(f"non-streaming disconnect: KV free {time.monotonic() - t0:.3f} s after the close",
              file=sys.stderr)
        self.assertLess(value(m, "vlm_generation_tokens_total") - generated0, 440)

    def test_streaming_disconnect_cancels_and_frees_kv(self):
        cancelled0 = self.metric(self.server, "vlm_requests_total", outcome="cancelled")
        s = connect(self.server.port)
        s.sendall(request_bytes("POST", "/v1/chat/completions", [f"Authorization: Bearer {KEY}"],
                                chat_body("Keep talking.", 440, ignore_eos=True, stream=True)))
        s.recv(1024)  # the header and the first chunk
        s.close()
        self.wait_for("the stream's KV blocks back", lambda: (
            self.metric(self.server, "vlm_kv_cache_blocks_used") == 0 and
            self.metric(self.server, "vlm_requests_total", outcome="cancelled") == cancelled0 + 1), 10)

    # ----- the process -----

    def test_open_file_limit_is_raised_to_the_hard_limit(self):
        limits = Path(f"/proc/{self.server.proc.pid}/limits").read_text()
        line = next(l for l in limits.splitlines() if l.startswith("Max open files"))
        soft, hard = line.split()[3:5]
        self.assertEqual(soft, hard, line)

    def test_second_server_on_a_taken_port_fails_to_start(self):
        r = subprocess.run([ARGS.vlm, "serve", "-m", str(self.model_dir), "--port", str(self.server.port)],
                           capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 1, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(f"cannot listen on 127.0.0.1:{self.server.port}", lines[0])
        self.assertIn("in use", lines[0])


class TimeoutsAndLimitsTest(unittest.TestCase):
    """Servers with short timeouts, few connections, a drain, a stalled engine."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="vlm_front_door_limits_"))
        cls.model_dir = serve_util.make_model_dir(ARGS.model_dir, cls.tmp / "model")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def start(self, name, args, **kw):
        server = VlmServer(ARGS.vlm, self.model_dir, self.tmp, name, args, **kw)
        self.addCleanup(server.stop)
        return server

    def test_idle_header_and_body_timeouts(self):
        server = self.start("timeouts", ["--keep-alive-timeout", "1", "--header-timeout", "1",
                                         "--body-timeout", "1"])
        with connect(server.port) as s:  # idle after a request: closed after ~1 s
            s.sendall(request_bytes("GET", "/health"))
            self.assertEqual(read_response(s)[0], 200)
            t0 = time.monotonic()
            self.assertTrue(closed_by_peer(s, 5))
            self.assertGreater(time.monotonic() - t0, 0.5)
        with connect(server.port) as s:  # a connection that never sends
            self.assertTrue(closed_by_peer(s, 5))
        with connect(server.port) as s:  # half a header
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            self.assertTrue(closed_by_peer(s, 5))
        with connect(server.port) as s:  # a body that stops coming
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            self.assertTrue(closed_by_peer(s, 5))
        self.assertEqual(send_once(server.port, "GET", "/health")[0], 200)

    def test_connections_over_the_limit_get_503(self):
        server = self.start("maxconn", ["--max-connections", "20"])
        held = [connect(server.port) for _ in range(20)]
        try:
            for s in held:  # each one is open and served
                s.sendall(request_bytes("GET", "/health"))
                self.assertEqual(read_response(s)[0], 200)
            with connect(server.port) as s:
                status, headers, body = read_response(s)
                self.assertEqual(status, 503, body)
                self.assertIn(b"too many open connections", body)
                self.assertEqual(headers.get("connection"), "close")
            held.pop().close()
            wait_until(lambda: send_once(server.port, "GET", "/health")[0] == 200, 5)
            for s in held:
                s.close()
            held.clear()
            wait_until(lambda: send_once(server.port, "GET", "/health")[0] == 200, 5)
            m = serve_util.metrics(server)[0]
            self.assertGreaterEqual(value(m, "vlm_http_connections_rejected_total"), 1)
        finally:
            for s in held:
                s.close()

    def test_sigterm_drains_running_requests_and_exits_0(self):
        server = self.start("drain", ["--max-num-seqs", "4", "--shutdown-timeout", "60"])
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            running = pool.submit(send_once, server.port, "POST", "/v1/chat/completions",
                                  chat_body("Go on.", 400, ignore_eos=True))
            streaming = pool.submit(send_once, server.port, "POST", "/v1/chat/completions",
                                    chat_body("Go on.", 400, ignore_eos=True, stream=True))
            wait_until(lambda: value(serve_util.metrics(server)[0], "vlm_num_requests_running") >= 2)
            with connect(server.port) as keep:  # an open connection from before the signal
                server.proc.send_signal(signal.SIGTERM)
                time.sleep(0.2)
                keep.sendall(request_bytes("GET", "/health"))
                status, _, body = read_response(keep)
                self.assertEqual(status, 503, body)
                self.assertIn(b"draining", body)
            status, headers, body = send_once(server.port, "POST", "/v1/chat/completions", chat_body())
            self.assertEqual(status, 503, body)
            self.assertEqual(headers.get("connection"), "close")
            status, _, body = running.result(timeout=120)
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["usage"]["completion_tokens"], 400)
            status, _, body = streaming.result(timeout=120)
            self.assertEqual(status, 200)
            self.assertTrue(body.endswith(b"data: [DONE]\n\n"), body[-200:])
        self.assertEqual(server.proc.wait(timeout=30), 0, server.output())

    def test_drain_cancels_what_is_left_at_the_shutdown_timeout(self):
        server = self.start("drain_timeout", ["--shutdown-timeout", "0.5"], ctx=4096)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            long = pool.submit(send_once, server.port, "POST", "/v1/chat/completions",
                               chat_body("Go on.", 4000, ignore_eos=True))
            wait_until(lambda: value(serve_util.metrics(server)[0], "vlm_num_requests_running") >= 1)
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            self.assertEqual(server.proc.wait(timeout=30), 0, server.output())
            self.assertLess(time.monotonic() - t0, 10)
            self.assertEqual(long.result(timeout=10)[0], 0)  # the connection closed unanswered

    def test_health_turns_503_when_the_engine_loop_stalls(self):
        # One engine step that encodes a 2560x1600 photo at full resolution (16,000 patches, all
        # attending to each other) takes far longer than the 0.2 s allowed here.
        server = self.start("heartbeat", ["--health-timeout", "0.2",
                                          "--allowed-media-path", str(REPO / "tests/data/images")],
                            ctx=8192)
        photo = REPO / "tests/data/images/retina_2560x1600.jpg"
        body = json.dumps({"model": MODEL, "max_tokens": 1, "max_pixels": 2560 * 1600, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"file://{photo}"}},
                                         {"type": "text", "text": "?"}]}]}).encode()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reply = pool.submit(send_once, server.port, "POST", "/v1/chat/completions", body)
            seen = set()
            while not reply.done():
                seen.add(send_once(server.port, "GET", "/health")[0])
                time.sleep(0.02)
            self.assertEqual(reply.result()[0], 200, reply.result()[2])
        self.assertIn(503, seen, "the stalled engine never showed in /health")
        self.assertEqual(send_once(server.port, "GET", "/health")[0], 200)


def send_once(port, method, path, body=b""):
    h = ["Content-Type: application/json"] if body else []
    try:
        with connect(port) as s:
            s.sendall(request_bytes(method, path, h, body))
            return read_response(s)
    except OSError:
        return 0, {}, b""


def wait_until(fn, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def main():
    serve_util.run_tests(ARGS, __doc__)

if __name__ == "__main__":
    main()
