#!/usr/bin/env python3
"""`vlm serve` driven by the official OpenAI Python client, /metrics read by prometheus_client.

The server runs as a subprocess on the full-vocabulary tiny fixture (random weights, the real
Qwen3 tokenizer), so replies are gibberish: the tests check structure, counts and equalities
between runs, never words. DefaultModelTest alone runs `vlm serve` without -m, on the shipped
tiny shapes model, and checks words: its answers about held-out pictures must be transformers'.
Registered with CTest by tests/CMakeLists.txt (label `server`):

  python3 tests/server/openai_client_test.py --vlm BUILD/tools/cli/vlm \\
      --model-dir tests/model/fixtures/tiny-fullvocab-bf16 [unittest args]

Needs the packages pinned in scripts/requirements-test.txt (scripts/test.sh makes the venv).
"""

import argparse
import base64
import concurrent.futures
import http.client
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import openai

import serve_util
from serve_util import MODEL, REPO, TIMEOUT

ARGS = argparse.Namespace(vlm=None, model_dir=None)
SMALL_PNG = REPO / "tests/unit/fixtures/images/png_rgb.png"  # 37x23 RGB
ALIAS = "tiny-alias"  # the test server's second --served-model-name


def VlmServer(model_dir, workdir, name, extra_args=()):
    return serve_util.VlmServer(ARGS.vlm, model_dir, workdir, name, extra_args)


def png_bytes(width, height, pixel):
    """A solid-colour RGB PNG, encoded with the standard library only."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes(pixel) * width
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b""))


def data_url(png):
    return "data:image/png;base64," + base64.b64encode(png).decode()


def user(content):
    return [{"role": "user", "content": content}]


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


class OpenAIClientTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="vlm_openai_test_"))
        cls.model_dir = serve_util.make_model_dir(ARGS.model_dir, cls.tmp / "model")
        cls.media_dir = cls.tmp / "media"
        cls.media_dir.mkdir()
        cls.png = SMALL_PNG.read_bytes()
        # A second served name (after serve_util's MODEL): requests may use either.
        cls.server = VlmServer(cls.model_dir, cls.tmp, "server",
                               ["--allowed-media-path", str(cls.media_dir),
                                "--served-model-name", ALIAS])

    @classmethod
    def tearDownClass(cls):
        alive = cls.server.proc.poll() is None
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if not alive:
            raise AssertionError(f"vlm serve exited during the tests:\n{cls.server.output()}")

    # ----- helpers -----

    def client(self, server=None, api_key="x"):
        server = server or self.server
        c = openai.OpenAI(base_url=server.url("/v1"), api_key=api_key, max_retries=0, timeout=TIMEOUT)
        self.addCleanup(c.close)
        return c

    def chat(self, messages, **kw):
        kw.setdefault("temperature", 0)
        return self.client().chat.completions.create(model=MODEL, messages=messages, **kw)

    def greedy(self, text, max_tokens, **kw):
        r = self.chat(user(text), max_tokens=max_tokens, extra_body={"ignore_eos": True}, **kw)
        return r.choices[0].message.content

    def raw_post(self, path, body, headers=None):
        """(status, parsed JSON body or raw bytes) of a POST sent without the OpenAI client."""
        h = {"Content-Type": "application/json", **(headers or {})}
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=TIMEOUT)
        try:
            conn.request("POST", path, body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
        finally:
            conn.close()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data

    def metrics(self, server=None):
        """{(sample name, sorted label items): value} and {family name: type} of GET /metrics."""
        return serve_util.metrics(server or self.server)

    value = staticmethod(serve_util.value)

    def assert_deltas(self, before, want, timeout=5.0):
        """Asserts that the samples of `want` ({(name, labels): increase}) rose by exactly that
        much since `before`; waits for counters bumped just after a reply is written. Returns
        the metrics read last."""
        deadline = time.monotonic() + timeout
        while True:
            after, _ = self.metrics()
            got = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in want}
            if all(got[k] >= want[k] for k in want) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(got, want)
        return after

    def wait_idle(self, timeout=20.0):
        """Waits until no request runs or waits and no KV block is held; returns the metrics."""
        deadline = time.monotonic() + timeout
        while True:
            m, _ = self.metrics()
            if (self.value(m, "vlm_num_requests_running") == 0 and
                    self.value(m, "vlm_num_requests_waiting") == 0 and
                    self.value(m, "vlm_kv_cache_blocks_used") == 0):
                return m
            if time.monotonic() > deadline:
                self.fail(f"server not idle after {timeout} s: running/waiting/kv_used = "
                          f"{self.value(m, 'vlm_num_requests_running')}/"
                          f"{self.value(m, 'vlm_num_requests_waiting')}/"
                          f"{self.value(m, 'vlm_kv_cache_blocks_used')}")
            time.sleep(0.05)

    def check_usage(self, usage, max_tokens=None):
        self.assertGreater(usage.prompt_tokens, 0)
        self.assertGreaterEqual(usage.completion_tokens, 0)
        self.assertEqual(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens)
        if max_tokens is not None:
            self.assertLessEqual(usage.completion_tokens, max_tokens)

    def expect_status(self, exc_type, status, fn):
        with self.assertRaises(exc_type) as cm:
            fn()
        self.assertEqual(cm.exception.status_code, status)
        body = cm.exception.body
        self.assertIsInstance(body, dict, f"error body is not a JSON object: {body!r}")
        self.assertIsInstance(body.get("message"), str, body)
        return cm.exception

    def vlm_tool(self, *args):
        r = subprocess.run([ARGS.vlm, *args], capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 0, f"vlm {' '.join(args[:1])} failed: {r.stderr}")
        return r.stdout

    # ----- models, plain and streamed chat -----


    def test_chat_plain(self):
        r = self.chat(user("Describe a cat."), max_tokens=12)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.model, MODEL)
        self.assertEqual(len(r.choices), 1)
        c = r.choices[0]
        self.assertEqual(c.index, 0)
        self.assertEqual(c.message.role, "assistant")
        self.assertIsInstance(c.message.content, str)
        self.assertIn(c.finish_reason, {"stop", "length"})
        self.check_usage(r.usage, max_tokens=12)
        if c.finish_reason == "length":
            self.assertEqual(r.usage.completion_tokens, 12)

    def test_chat_stream_equals_plain(self):
        want = self.chat(user("Tell me about the sea."), max_tokens=20)
        stream = self.client().chat.completions.create(
            model=MODEL, messages=user("Tell me about the sea."), max_tokens=20, temperature=0,
            stream=True, stream_options={"include_usage": True})
        text, finish, usage, n_chunks = "", None, None, 0
        for chunk in stream:
            n_chunks += 1
            self.assertEqual(chunk.object, "chat.completion.chunk")
            if chunk.usage is not None:
                self.assertEqual(chunk.choices, [])
                usage = chunk.usage
                continue
            self.assertEqual(len(chunk.choices), 1)
            self.assertIsNone(usage, "content after the usage chunk")
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].finish_reason is not None:
                finish = chunk.choices[0].finish_reason
        self.assertEqual(text, want.choices[0].message.content)
        self.assertEqual(finish, want.choices[0].finish_reason)
        self.assertIsNotNone(usage, "no usage chunk with stream_options.include_usage")
        self.assertEqual(usage.prompt_tokens, want.usage.prompt_tokens)
        self.assertEqual(usage.completion_tokens, want.usage.completion_tokens)
        self.assertEqual(usage.total_tokens, want.usage.total_tokens)

    def test_stream_continuous_usage_stats(self):
        """vLLM's stream_options.continuous_usage_stats (what GuideLLM sends): with include_usage
        every chunk after the role chunk carries the usage so far; without it, none does."""
        want = self.chat(user("Count the waves."), max_tokens=10, extra_body={"ignore_eos": True})
        for include, continuous in ((True, True), (False, True), (True, False)):
            with self.subTest(include_usage=include, continuous=continuous):
                stream = self.client().chat.completions.create(
                    model=MODEL, messages=user("Count the waves."), max_tokens=10, temperature=0,
                    stream=True, extra_body={"ignore_eos": True},
                    stream_options={"include_usage": include, "continuous_usage_stats": continuous})
                chunks = list(stream)
                content = [c for c in chunks if c.choices and (c.choices[0].delta.content or
                                                               c.choices[0].finish_reason)]
                self.assertTrue(content)
                if include and continuous:
                    counts = [c.usage.completion_tokens for c in content]
                    self.assertEqual(counts, sorted(counts), "usage so far never goes down")
                    self.assertEqual(counts[-1], want.usage.completion_tokens)
                    for c in content:
                        self.assertEqual(c.usage.prompt_tokens, want.usage.prompt_tokens)
                        self.assertEqual(c.usage.total_tokens,
                                         c.usage.prompt_tokens + c.usage.completion_tokens)
                else:
                    self.assertTrue(all(c.usage is None for c in content))
                self.assertEqual(chunks[-1].usage is not None, include)

    def test_chat_images_count_as_prompt_tokens(self):
        url = data_url(self.png)
        none = self.chat(user("What is this?"), max_tokens=2)
        one = self.chat(user([image_part(url), {"type": "text", "text": "What is this?"}]), max_tokens=2)
        two = self.chat(user([image_part(url), image_part(url), {"type": "text", "text": "What is this?"}]),
                        max_tokens=2)
        per_image = one.usage.prompt_tokens - none.usage.prompt_tokens
        self.assertGreaterEqual(per_image, 16, "an image should add many tokens")
        self.assertEqual(two.usage.prompt_tokens - none.usage.prompt_tokens, 2 * per_image)
        for r in (one, two):
            self.check_usage(r.usage, max_tokens=2)

    def test_chat_stop_strings(self):
        prompt = "Write a long story about a lighthouse."
        full = self.greedy(prompt, 24)
        self.assertGreaterEqual(len(full), 8, f"reply too short to cut: {full!r}")
        mid = len(full) // 2
        stop = full[mid:mid + 3]
        r = self.chat(user(prompt), max_tokens=24, stop=[stop], extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].message.content, full[:full.find(stop)], f"stop={stop!r}")
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_chat_seed_determinism(self):
        def sample(seed):
            return self.chat(user("Pick random words."), max_tokens=32, temperature=1.0, seed=seed,
                             extra_body={"ignore_eos": True}).choices[0].message.content

        a, b, c = sample(1234), sample(1234), sample(1235)
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)

    def test_chat_max_tokens_length(self):
        r = self.chat(user("Count to one hundred."), max_tokens=5, extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 5)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_chat_n2(self):
        msgs = user("Name two colours.")
        r = self.chat(msgs, max_tokens=10, temperature=1.0, seed=7, n=2, extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in r.choices], [0, 1])
        self.assertEqual(r.usage.completion_tokens, 20)
        # Choice i samples with seed + i.
        for i, c in enumerate(r.choices):
            single = self.chat(msgs, max_tokens=10, temperature=1.0, seed=7 + i,
                               extra_body={"ignore_eos": True})
            self.assertEqual(c.message.content, single.choices[0].message.content, f"choice {i}")
        g = self.chat(msgs, max_tokens=10, n=2)
        want = self.chat(msgs, max_tokens=10)
        self.assertEqual([c.message.content for c in g.choices], [want.choices[0].message.content] * 2)
        self.assertEqual(g.usage.completion_tokens, 2 * want.usage.completion_tokens)
        self.assertEqual(g.usage.prompt_tokens, want.usage.prompt_tokens)

    def test_chat_logprobs(self):
        r = self.chat(user("Describe a dog."), max_tokens=8, logprobs=True, top_logprobs=3,
                      extra_body={"ignore_eos": True})
        c = r.choices[0]
        self.assertIsNotNone(c.logprobs, "no logprobs in the choice")
        content = c.logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        plain = self.chat(user("Describe a dog."), max_tokens=8, extra_body={"ignore_eos": True})
        self.assertEqual(c.message.content, plain.choices[0].message.content)
        for j, e in enumerate(content):
            self.assertIsInstance(e.token, str)
            self.assertTrue(all(isinstance(b, int) and 0 <= b < 256 for b in e.bytes), e.bytes)
            self.assertLessEqual(e.logprob, 0.0)
            self.assertEqual(len(e.top_logprobs), 3, f"token {j}")
            tops = [t.logprob for t in e.top_logprobs]
            self.assertEqual(tops, sorted(tops, reverse=True), f"token {j}: not sorted")
            self.assertTrue(all(t <= 0.0 for t in tops))
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(e.logprob, tops[0], delta=1e-4, msg=f"token {j}")
            self.assertEqual(e.token, e.top_logprobs[0].token, f"token {j}")

    # ----- /v1/completions -----

    def test_completions_logprobs_match_model_logits(self):
        prompt_ids = json.loads(self.vlm_tool("tokenize", "-m", str(self.model_dir),
                                              "--text", "The quick brown fox"))
        n_gen = 6
        r = self.client().completions.create(model=MODEL, prompt=prompt_ids, max_tokens=n_gen,
                                             temperature=0, logprobs=3, extra_body={"ignore_eos": True})
        self.assertEqual(r.object, "text_completion")
        lp = r.choices[0].logprobs
        self.assertIsNotNone(lp, "no logprobs in the choice")
        self.assertEqual(len(lp.tokens), n_gen)
        self.assertEqual(len(lp.token_logprobs), n_gen)
        self.assertEqual(len(lp.top_logprobs), n_gen)
        self.assertEqual(len(lp.text_offset), n_gen)
        self.assertEqual(lp.text_offset, sorted(lp.text_offset))
        # The model's own logits (vlm logits: every position of a fresh prompt), one step at a time.
        ids = list(prompt_ids)
        out = self.tmp / "logits.npy"
        for i in range(n_gen):
            self.vlm_tool("logits", "-m", str(self.model_dir), "--ids", ",".join(map(str, ids)),
                          "--out", str(out), "-t", "2")
            row = np.load(out)[-1].astype(np.float64)
            ls = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
            top = np.sort(ls)[::-1][:3]
            self.assertAlmostEqual(lp.token_logprobs[i], top[0], delta=1e-3, msg=f"step {i}")
            got = sorted(lp.top_logprobs[i].values(), reverse=True)
            self.assertTrue(1 <= len(got) <= 3, lp.top_logprobs[i])
            self.assertAlmostEqual(got[0], top[0], delta=1e-3, msg=f"step {i}")
            for v in got:  # tokens with equal text may share one key, so compare as a subset
                self.assertLess(np.abs(top - v).min(), 1e-3, f"step {i}: {v} not in top-3 {top}")
            ids.append(int(np.argmax(ls)))
        text = self.vlm_tool("detokenize", "-m", str(self.model_dir),
                             "--ids", ",".join(map(str, ids[len(prompt_ids):])))
        self.assertEqual(r.choices[0].text, text[:-1])  # vlm detokenize ends with one newline

    def test_completions_prompt_string_plain_and_stream(self):
        c = self.client()
        r = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0,
                                 echo=False)
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(len(r.choices), 1)
        self.assertEqual(r.choices[0].index, 0)
        self.assertIn(r.choices[0].finish_reason, {"stop", "length"})
        self.check_usage(r.usage, max_tokens=10)
        self.assertFalse(r.choices[0].text.startswith("Once upon a time"), "echo=False echoed the prompt")
        text, finish = "", None
        for chunk in c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10,
                                          temperature=0, stream=True):
            for ch in chunk.choices:
                text += ch.text
                finish = ch.finish_reason or finish
        self.assertEqual(text, r.choices[0].text)
        self.assertEqual(finish, r.choices[0].finish_reason)
        # max_tokens defaults to 16, like OpenAI's legacy API.
        d = c.completions.create(model=MODEL, prompt="Once upon a time", temperature=0,
                                 extra_body={"ignore_eos": True})
        self.assertEqual(d.usage.completion_tokens, 16)
        self.assertEqual(d.choices[0].finish_reason, "length")

    def test_completions_prompt_token_ids(self):
        text = "A list of fruits:"
        ids = json.loads(self.vlm_tool("tokenize", "-m", str(self.model_dir), "--text", text))
        c = self.client()
        by_text = c.completions.create(model=MODEL, prompt=text, max_tokens=8, temperature=0)
        by_ids = c.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
        self.assertEqual(by_ids.usage.prompt_tokens, len(ids))
        self.assertEqual(by_text.usage.prompt_tokens, len(ids))
        self.assertEqual(by_ids.choices[0].text, by_text.choices[0].text)

    def test_completions_n2_and_prompt_list(self):
        c = self.client()
        prompts = ["The weather today", "My favourite book"]
        r = c.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=6, temperature=0,
                                 extra_body={"ignore_eos": True})
        self.assertEqual([ch.index for ch in r.choices], [0, 1, 2, 3])
        self.assertEqual(r.usage.completion_tokens, 4 * 6)
        for p, prompt in enumerate(prompts):
            want = c.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                        extra_body={"ignore_eos": True}).choices[0].text
            # choice index = prompt_index * n + i
            self.assertEqual([r.choices[2 * p].text, r.choices[2 * p + 1].text], [want, want], prompt)

    # ----- errors -----

    def test_error_auth_401(self):
        srv = VlmServer(self.model_dir, self.tmp, "server_auth", ["--api-key", "sekret"])
        self.addCleanup(srv.stop)
        wrong, right = self.client(srv, "wrong"), self.client(srv, "sekret")
        e = self.expect_status(openai.AuthenticationError, 401, lambda: wrong.chat.completions.create(
            model=MODEL, messages=user("hi"), max_tokens=2))
        self.assertEqual(e.body.get("type"), "authentication_error")
        self.expect_status(openai.AuthenticationError, 401, lambda: wrong.models.list())
        ok = right.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=2)
        self.assertEqual(len(ok.choices), 1)
        self.assertEqual([m.id for m in right.models.list()], [MODEL])

    def test_error_unknown_model_404(self):
        e = self.expect_status(openai.NotFoundError, 404, lambda: self.client().chat.completions.create(
            model="gpt-9", messages=user("hi"), max_tokens=2))
        self.assertIn("gpt-9", e.body["message"])

    def test_error_body_too_large_413(self):
        # 33 MiB, over the 32 MiB limit. Headers first: a server that refuses by Content-Length
        # answers before the body, one that reads it first gets it.
        body = b'{"messages": "' + b"a" * (33 << 20) + b'"}'
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=TIMEOUT)
        self.addCleanup(conn.close)
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        if not select.select([conn.sock], [], [], 2.0)[0]:
            try:
                conn.send(body)
            except (BrokenPipeError, ConnectionResetError):
                pass
        r = conn.getresponse()
        self.assertEqual(r.status, 413)
        r.read()

    def test_error_malformed_json_400(self):
        status, body = self.raw_post("/v1/chat/completions", b"{bad json")
        self.assertEqual(status, 400)
        self.assertIn("error", body)
        self.assertEqual(body["error"]["type"], "invalid_request_error")

    def test_error_wrong_types_400(self):
        e = self.expect_status(openai.BadRequestError, 400, lambda: self.client().chat.completions.create(
            model=MODEL, messages=user("hi"), max_tokens=2, temperature="hot"))
        self.assertIn("temperature", e.body["message"])
        self.expect_status(openai.BadRequestError, 400, lambda: self.client().chat.completions.create(
            model=MODEL, messages="hi", max_tokens=2))
        self.expect_status(openai.BadRequestError, 400, lambda: self.client().chat.completions.create(
            model=MODEL, messages=user("hi"), max_tokens="many"))

    def test_error_bad_base64_400(self):
        e = self.expect_status(openai.BadRequestError, 400, lambda: self.chat(
            user([image_part("data:image/png;base64,@@@not base64@@@"), {"type": "text", "text": "x"}]),
            max_tokens=2))
        self.assertIn("base64", e.body["message"])

    def test_error_undecodable_image_400(self):
        garbage = bytes(range(256)) * 4
        self.expect_status(openai.BadRequestError, 400, lambda: self.chat(
            user([image_part(data_url(garbage)), {"type": "text", "text": "x"}]), max_tokens=2))

    def test_error_prompt_longer_than_context_400(self):
        words = " ".join(f"word{i}" for i in range(3000))
        e = self.expect_status(openai.BadRequestError, 400,
                               lambda: self.chat(user(words), max_tokens=4))
        self.assertIn("context", e.body["message"])

    def test_error_remote_image_url_refused(self):
        self.expect_status(openai.BadRequestError, 400, lambda: self.chat(
            user([image_part("http://127.0.0.1:9/cat.png"), {"type": "text", "text": "x"}]), max_tokens=2))

    def test_error_file_url_outside_allowed_path_refused(self):
        outside = self.tmp / "outside.png"  # beside the allowed folder
        outside.write_bytes(self.png)
        (self.media_dir / "escape.png").symlink_to(outside)
        self.addCleanup((self.media_dir / "escape.png").unlink)
        for url in (outside.as_uri(),                            # plainly outside
                    f"file://{self.media_dir}/../outside.png",   # climbs out with ..
                    (self.media_dir / "escape.png").as_uri()):   # a symlink inside pointing out
            with self.subTest(url=url):
                self.expect_status(openai.BadRequestError, 400, lambda: self.chat(
                    user([image_part(url), {"type": "text", "text": "x"}]), max_tokens=2))

    def test_file_url_inside_allowed_path_works(self):
        inside = self.media_dir / "inside.png"
        inside.write_bytes(self.png)
        r = self.chat(user([image_part(inside.as_uri()), {"type": "text", "text": "x"}]), max_tokens=2)
        want = self.chat(user([image_part(data_url(self.png)), {"type": "text", "text": "x"}]), max_tokens=2)
        self.assertEqual(r.usage.prompt_tokens, want.usage.prompt_tokens)
        self.assertEqual(r.choices[0].message.content, want.choices[0].message.content)

    # ----- /metrics -----

    def test_metrics_families_present(self):
        _, types = self.metrics()
        want = {
            "vlm_requests_total": "counter",
            "vlm_prompt_tokens_total": "counter",
            "vlm_generation_tokens_total": "counter",
            "vlm_time_to_first_token_seconds": "histogram",
            "vlm_inter_token_latency_seconds": "histogram",
            "vlm_e2e_request_latency_seconds": "histogram",
            "vlm_num_requests_running": "gauge",
            "vlm_num_requests_waiting": "gauge",
            "vlm_kv_cache_blocks_used": "gauge",
            "vlm_kv_cache_blocks_capacity": "gauge",
            "vlm_request_queue_time_seconds": "histogram",
            "vlm_image_preprocess_seconds": "histogram",
            "vlm_vision_encode_seconds": "histogram",
            "vlm_image_tokens_total": "counter",
            "vlm_vision_cache_hits_total": "counter",
            "vlm_vision_cache_misses_total": "counter",
        }
        missing = sorted(n for n in want if n not in types)
        self.assertEqual(missing, [], "metric families missing from /metrics")
        self.assertEqual({n: types[n] for n in want}, want)

    def test_metrics_counters_increase(self):
        before = self.wait_idle()
        r = self.chat(user("Count my tokens."), max_tokens=7, extra_body={"ignore_eos": True})
        want = {
            ("vlm_generation_tokens_total", ()): r.usage.completion_tokens,
            ("vlm_prompt_tokens_total", ()): r.usage.prompt_tokens,
            ("vlm_requests_total", (("outcome", "ok"),)): 1,
            ("vlm_time_to_first_token_seconds_count", ()): 1,
            ("vlm_e2e_request_latency_seconds_count", ()): 1,
            ("vlm_inter_token_latency_seconds_count", ()): r.usage.completion_tokens - 1,
        }
        after = self.assert_deltas(before, want)
        self.assertGreater(self.value(after, "vlm_kv_cache_blocks_capacity"), 0)

    # vLLM's bucket bounds, as its metrics module defines them.
    VLLM_BUCKETS = {
        "vllm:time_to_first_token_seconds": [
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
        "vllm:inter_token_latency_seconds": [
            0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
            20.0, 40.0, 80.0],
        "vllm:e2e_request_latency_seconds": [
            0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
            240.0, 480.0, 960.0, 1920.0, 7680.0],
    }

    def test_metrics_under_vllm_names(self):
        """The names routers read: vLLM's families, types, labels and buckets, counting what
        vlm's own metrics count."""
        _, types = self.metrics()
        want_types = {
            "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
            "vllm:kv_cache_usage_perc": "gauge", "vllm:cache_config_info": "gauge",
            "vllm:prefix_cache_queries_total": "counter", "vllm:prefix_cache_hits_total": "counter",
            "vllm:prompt_tokens_total": "counter", "vllm:generation_tokens_total": "counter",
            "vllm:time_to_first_token_seconds": "histogram",
            "vllm:inter_token_latency_seconds": "histogram",
            "vllm:e2e_request_latency_seconds": "histogram",
        }
        self.assertEqual({n: types.get(n) for n in want_types}, want_types)
        lab = (("engine", "0"), ("model_name", MODEL))
        before = self.wait_idle()
        r = self.chat(user("Count my tokens twice."), max_tokens=6, extra_body={"ignore_eos": True})
        want = {
            ("vllm:generation_tokens_total", lab): r.usage.completion_tokens,
            ("vllm:prompt_tokens_total", lab): r.usage.prompt_tokens,
            ("vllm:time_to_first_token_seconds_count", lab): 1,
            ("vllm:e2e_request_latency_seconds_count", lab): 1,
            ("vllm:inter_token_latency_seconds_count", lab): r.usage.completion_tokens - 1,
        }
        after = self.assert_deltas(before, want)
        # The same counts as vlm's own names.
        for vllm_name, vlm_name in (("vllm:prefix_cache_queries_total", "vlm_prefix_cache_queries_total"),
                                    ("vllm:prefix_cache_hits_total", "vlm_prefix_cache_hits_total"),
                                    ("vllm:prompt_tokens_total", "vlm_prompt_tokens_total"),
                                    ("vllm:generation_tokens_total", "vlm_generation_tokens_total")):
            self.assertEqual(after[(vllm_name, lab)], self.value(after, vlm_name), vllm_name)
        # KV usage is the share of blocks in use; the cache's configuration is an info gauge.
        idle = self.wait_idle()
        self.assertEqual(idle[("vllm:kv_cache_usage_perc", lab)], 0.0)
        info = [(labels, v) for (name, labels), v in idle.items() if name == "vllm:cache_config_info"]
        self.assertEqual(len(info), 1)
        labels, v = dict(info[0][0]), info[0][1]
        self.assertEqual(v, 1.0)
        self.assertEqual(labels["block_size"], "8")  # serve_util's --block-size
        self.assertEqual(float(labels["num_gpu_blocks"]), self.value(idle, "vlm_kv_cache_blocks_capacity"))
        self.assertEqual(labels["enable_prefix_caching"], "True")
        # vLLM's bucket bounds.
        for name, bounds in self.VLLM_BUCKETS.items():
            les = sorted(float(dict(l)["le"]) for (n, l) in idle if n == name + "_bucket")
            self.assertEqual(les, bounds + [float("inf")], name)

    def test_served_model_names(self):
        """Every --served-model-name is listed and accepted; replies carry the first."""
        c = self.client()
        self.assertEqual([m.id for m in c.models.list().data], [MODEL, ALIAS])
        r = c.chat.completions.create(model=ALIAS, messages=user("hi"), max_tokens=2)
        self.assertEqual(r.model, MODEL)
        with self.assertRaises(openai.NotFoundError):
            c.chat.completions.create(model="not-served", messages=user("hi"), max_tokens=2)

    def test_router_worker_endpoints(self):
        """SGLang's worker endpoints, which smg reads to register a replica and balance load:
        the values are the server's own (its flags and /metrics)."""
        def get(path):
            with urllib.request.urlopen(self.server.url(path), timeout=TIMEOUT) as r:
                self.assertEqual(r.headers["Content-Type"], "application/json")
                return json.loads(r.read())

        info = get("/server_info")
        idle = self.wait_idle()
        capacity = self.value(idle, "vlm_kv_cache_tokens_capacity")
        self.assertEqual(info["served_model_name"], MODEL)
        self.assertEqual(info["context_length"], serve_util.CTX)
        self.assertEqual(info["max_total_tokens"], capacity)
        self.assertEqual(info["max_running_requests"], 4)  # serve_util's --max-num-seqs
        self.assertEqual((info["tp_size"], info["dp_size"], info["is_embedding"]), (1, 1, False))
        self.assertTrue(info["version"].startswith("vlm "))
        model = get("/model_info")
        config = json.loads((Path(ARGS.model_dir) / "config.json").read_text())
        self.assertEqual(model["model_type"], config["model_type"])
        self.assertEqual(model["architectures"], config["architectures"])
        self.assertTrue(model["is_generation"])
        self.assertTrue(model["has_image_understanding"])
        self.assertEqual([m["max_model_len"] for m in get("/v1/models")["data"]],
                         [serve_util.CTX, serve_util.CTX])
        get("/v1/loads?include=core")  # starts the generation-rate window
        self.chat(user("Load me up."), max_tokens=8, extra_body={"ignore_eos": True})
        self.wait_idle()
        loads = get("/v1/loads?include=core")
        self.assertEqual(loads["dp_rank_count"], 1)
        (rank,) = loads["loads"]
        self.assertEqual((rank["dp_rank"], rank["num_running_reqs"], rank["num_waiting_reqs"],
                          rank["num_used_tokens"], rank["token_usage"]), (0, 0, 0, 0, 0.0))
        self.assertEqual(rank["max_total_num_tokens"], capacity)
        self.assertGreater(rank["gen_throughput"], 0)
        m = self.metrics()[0]
        queries = self.value(m, "vlm_prefix_cache_queries_total")
        self.assertAlmostEqual(rank["cache_hit_rate"],
                               self.value(m, "vlm_prefix_cache_hits_total") / queries if queries else 0.0)
        time.strptime(loads["timestamp"].split(".")[0], "%Y-%m-%dT%H:%M:%S")

    def test_metrics_vision_cache_hit(self):
        url = data_url(png_bytes(48, 40, (os.getpid() % 251, 17, 201)))  # an image no other test sends
        msgs = user([image_part(url), {"type": "text", "text": "Again?"}])
        m0 = self.wait_idle()
        _, types = self.metrics()
        for n in ("vlm_vision_cache_hits_total", "vlm_vision_cache_misses_total", "vlm_image_tokens_total",
                  "vlm_vision_encode_seconds", "vlm_image_preprocess_seconds"):
            self.assertIn(n, types, f"{n} missing from /metrics")
        first = self.chat(msgs, max_tokens=2)
        m1 = self.wait_idle()
        second = self.chat(msgs, max_tokens=2)
        m2 = self.wait_idle()

        def delta(a, b, name):
            return self.value(b, name) - self.value(a, name)

        self.assertEqual(delta(m0, m1, "vlm_vision_cache_misses_total"), 1)
        self.assertEqual(delta(m0, m1, "vlm_vision_cache_hits_total"), 0)
        self.assertEqual(delta(m1, m2, "vlm_vision_cache_hits_total"), 1)
        self.assertEqual(delta(m1, m2, "vlm_vision_cache_misses_total"), 0)
        self.assertGreaterEqual(delta(m0, m1, "vlm_vision_encode_seconds_count"), 1)
        self.assertGreaterEqual(delta(m0, m1, "vlm_image_preprocess_seconds_count"), 1)
        image_tokens = delta(m0, m1, "vlm_image_tokens_total")
        self.assertGreater(image_tokens, 0)
        self.assertLess(image_tokens, first.usage.prompt_tokens)
        self.assertEqual(delta(m1, m2, "vlm_image_tokens_total"), image_tokens)
        self.assertEqual(second.usage.prompt_tokens, first.usage.prompt_tokens)
        self.assertEqual(second.choices[0].message.content, first.choices[0].message.content)

    # ----- concurrency and cancellation -----

    def test_concurrent_streams_equal_sequential(self):
        prompts = [f"Question number {i}: what comes next?" for i in range(16)]
        want = [self.greedy(p, 16) for p in prompts]

        def stream(p):
            c = openai.OpenAI(base_url=self.server.url("/v1"), api_key="x", max_retries=0, timeout=TIMEOUT)
            try:
                text = ""
                for chunk in c.chat.completions.create(model=MODEL, messages=user(p), max_tokens=16,
                                                       temperature=0, stream=True,
                                                       extra_body={"ignore_eos": True}):
                    for ch in chunk.choices:
                        text += ch.delta.content or ""
                return text
            finally:
                c.close()

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            got = list(pool.map(stream, prompts))
        for i, (g, w) in enumerate(zip(got, want)):
            self.assertEqual(g, w, f"request {i}")

    def test_cancel_mid_stream_frees_kv(self):
        before = self.wait_idle()
        cancelled0 = self.value(before, "vlm_requests_total", outcome="cancelled")
        stream = self.client().chat.completions.create(
            model=MODEL, messages=user("Go on forever."), max_tokens=450, temperature=0, stream=True,
            extra_body={"ignore_eos": True})
        it = iter(stream)
        next(it)
        next(it)
        stream.close()
        deadline = time.monotonic() + 20
        while True:
            m, _ = self.metrics()
            state = (self.value(m, "vlm_kv_cache_blocks_used"), self.value(m, "vlm_num_requests_running"),
                     self.value(m, "vlm_requests_total", outcome="cancelled") - cancelled0)
            if state == (0, 0, 1):
                break
            if time.monotonic() > deadline:
                self.fail(f"after the client left: kv_used, running, cancelled delta = {state}")
            time.sleep(0.05)
        # The request was cut short, not run to the end.
        self.assertLess(self.value(m, "vlm_generation_tokens_total") -
                        self.value(before, "vlm_generation_tokens_total"), 450)

    # ----- last (unittest runs methods in name order) -----

    def test_zz_server_still_up(self):
        self.assertIsNone(self.server.proc.poll(), self.server.output())
        with urllib.request.urlopen(self.server.url("/health"), timeout=TIMEOUT) as r:
            self.assertEqual(r.status, 200)
        r = self.chat(user("Still there?"), max_tokens=3)
        self.assertEqual(len(r.choices), 1)
        self.check_usage(r.usage, max_tokens=3)


class ToolCallTest(unittest.TestCase):
    """Tool calls and reasoning through the official client, on tests/model/fixtures/forced-reply
    (scripts/make_forced_reply_fixture.py): a checkpoint whose greedy reply to anything is
    `<think>Weather needs a tool.</think><tool_call>{"name":"get_weather","arguments":{"city":
    "Oslo"}}</tool_call>`, so the test does not depend on luck."""

    TOOLS = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    ASK = [{"role": "user", "content": "What's the weather in Oslo?"}]

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="vlm_tool_test_"))
        model = serve_util.make_model_dir(REPO / "tests/model/fixtures/forced-reply", cls.tmp / "model")
        cls.server = VlmServer(model, cls.tmp, "server_tools")
        cls.client = openai.OpenAI(base_url=cls.server.url("/v1"), api_key="x", max_retries=0,
                                   timeout=TIMEOUT)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def create(self, **kw):
        args = dict(model=MODEL, messages=self.ASK, temperature=0, max_tokens=64)
        args.update(kw)
        return self.client.chat.completions.create(**args)

    def streamed(self, **kw):
        """The stream's pieces put together as the client sees them (with tools parsed, no piece
        of content may hold a tool call tag)."""
        parsing = bool(kw.get("tools")) and kw.get("tool_choice") != "none"
        content, reasoning, calls, finish = "", "", {}, None
        for chunk in self.create(stream=True, **kw):
            for ch in chunk.choices:
                d = ch.delta
                content += d.content or ""
                extra = d.model_extra or {}
                self.assertEqual(extra.get("reasoning"), extra.get("reasoning_content"))
                reasoning += extra.get("reasoning_content") or ""
                if parsing:
                    self.assertNotIn("<tool_call", d.content or "", "a tool call tag leaked as content")
                for t in d.tool_calls or []:
                    c = calls.setdefault(t.index, {"id": None, "name": None, "arguments": ""})
                    if t.id:
                        self.assertIsNone(c["id"], "id sent twice")
                        c["id"], c["name"] = t.id, t.function.name
                    else:
                        self.assertIsNotNone(c["id"], "arguments before the id and name")
                    c["arguments"] += t.function.arguments or ""
                finish = ch.finish_reason or finish
        return content, reasoning, [calls[i] for i in sorted(calls)], finish

    def test_tool_call_and_reasoning(self):
        r = self.create(tools=self.TOOLS)
        msg = r.choices[0].message
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertIsNone(msg.content)
        self.assertEqual(msg.model_extra.get("reasoning_content"), "Weather needs a tool.")
        self.assertEqual(msg.model_extra.get("reasoning"), "Weather needs a tool.")
        self.assertEqual(len(msg.tool_calls), 1)
        call = msg.tool_calls[0]
        self.assertEqual(call.type, "function")
        self.assertTrue(call.id.startswith("call_"))
        self.assertEqual(call.function.name, "get_weather")
        self.assertEqual(json.loads(call.function.arguments), {"city": "Oslo"})
        # Streamed: the same call, id and name first, then the arguments; no tag as content.
        content, reasoning, calls, finish = self.streamed(tools=self.TOOLS)
        self.assertEqual(content, "")
        self.assertEqual(reasoning, "Weather needs a tool.")
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(len(calls), 1)
        self.assertTrue(calls[0].pop("id").startswith("call_"))  # each reply its own ids
        self.assertEqual(calls, [{"name": "get_weather", "arguments": call.function.arguments}])
        # The tool's result goes back through the template, and the model is asked again.
        follow = self.ASK + [
            {"role": "assistant", "content": None, "reasoning_content": "Weather needs a tool.",
             "tool_calls": [{"id": call.id, "type": "function",
                             "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 3}'}]
        again = self.create(tools=self.TOOLS, messages=follow)
        self.assertEqual(again.choices[0].message.tool_calls[0].function.name, "get_weather")
        self.assertGreater(again.usage.prompt_tokens, r.usage.prompt_tokens)

    def test_modes(self):
        # tool_choice "none", and no tools at all: the call stays text; reasoning is split.
        for kw in ({"tools": self.TOOLS, "tool_choice": "none"}, {}):
            r = self.create(**kw)
            msg = r.choices[0].message
            self.assertIsNone(msg.tool_calls)
            self.assertEqual(r.choices[0].finish_reason, "stop")
            self.assertTrue(msg.content.startswith("<tool_call>{\"name\":\"get_weather\""), msg.content)
            self.assertEqual(msg.model_extra.get("reasoning_content"), "Weather needs a tool.")
            content, reasoning, calls, finish = self.streamed(**kw)
            self.assertEqual((content, reasoning, calls, finish),
                             (msg.content, "Weather needs a tool.", [], "stop"))
        # max_thinking_tokens: after that many tokens of reasoning the next one is </think>
        # (the forced model then goes on with its call); 0 closes it at once.
        for budget, want in ((2, "Weather needs"), (0, None)):
            r = self.create(tools=self.TOOLS, extra_body={"max_thinking_tokens": budget})
            msg = r.choices[0].message
            self.assertEqual((msg.model_extra or {}).get("reasoning_content"), want, budget)
            self.assertEqual(msg.tool_calls[0].function.name, "get_weather")
            self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        # include_reasoning false drops it.
        r = self.create(tools=self.TOOLS, extra_body={"include_reasoning": False})
        self.assertNotIn("reasoning_content", r.choices[0].message.model_extra or {})
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        # tool_choice "required" and named calls are enforced by a grammar (structured_output_test
        # checks them on a random model, which this position-forced checkpoint is not).
        # A named function that is not among the tools is refused.
        with self.assertRaises(openai.BadRequestError) as e:
            self.create(tools=self.TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
        self.assertIn("tool_choice", str(e.exception))


class DefaultModelTest(unittest.TestCase):
    """`vlm serve` without -m serves the shipped tiny model (models/tiny-qwen35), which answers
    questions about pictures of shapes and clips of moving shapes. The held-out scenes of
    tests/model/fixtures/shapes-qa, then clips of tests/model/fixtures/motion-qa, are asked all at
    once (continuous batching mixes them): every greedy reply must be the answer transformers gave
    for that scene or clip."""

    def test_answers_equal_transformers_under_concurrency(self):
        fixtures = REPO / "tests/model/fixtures"
        cases_file = "cases-tiny-qwen35.json"  # the default model's
        scenes = json.loads((fixtures / "shapes-qa" / cases_file).read_text())["cases"]
        # Clips of moving shapes, sent as video_url parts.
        clips = json.loads((fixtures / "motion-qa" / cases_file).read_text())["cases"][:32]
        self.assertEqual(len(clips), 32)
        tmp = Path(tempfile.mkdtemp(prefix="vlm_default_model_test_"))
        server = VlmServer(None, tmp, "server_default")
        try:
            client = openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0,
                                   timeout=TIMEOUT)

            def ask(part, case):
                r = client.chat.completions.create(
                    model=MODEL, temperature=0, max_tokens=32,
                    messages=user([part, {"type": "text", "text": case["question"]}]))
                return r.choices[0].message.content

            def ask_scene(case):
                url = data_url((fixtures / "shapes-qa" / case["image"]).read_bytes())
                return ask(image_part(url), case)

            def ask_clip(case):
                url = "data:image/gif;base64," + base64.b64encode(
                    (fixtures / "motion-qa" / case["video"]).read_bytes()).decode()
                return ask({"type": "video_url", "video_url": {"url": url}}, case)

            for cases, ask_case, key in [(scenes, ask_scene, "image"), (clips, ask_clip, "video")]:
                with concurrent.futures.ThreadPoolExecutor(8) as pool:
                    replies = list(pool.map(ask_case, cases))
                for case, reply in zip(cases, replies):
                    self.assertEqual(reply, case["transformers"], f"{case[key]}: {case['question']}")
            client.close()
        finally:
            server.stop()
            shutil.rmtree(tmp, ignore_errors=True)


def main():
    serve_util.run_tests(ARGS, __doc__)

if __name__ == "__main__":
    main()
