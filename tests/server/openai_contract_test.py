#!/usr/bin/env python3
"""The OpenAI API contract of `vlm serve`, case by case.

Two groups:
- ValidationTest: the request-validation rules of the server (bounded JSON, images priced before
  they are decoded, overflow-safe numbers, parameters read or refused by name, logit_bias,
  logprobs that add up to the text, errors that reveal nothing of the server).
- PeerContractTest: OpenAI-contract cases ported from two peers' server test suites, llama.cpp
  (ggml-org/llama.cpp, tools/server/tests/unit/) and vLLM (vllm-project/vllm,
  tests/entrypoints/openai/). Each test names the test it came from; the code is ours, and where
  the original checks words, these check equalities between runs instead (the model is a
  random-weight one, so its text is gibberish). A few cases the peers do not test come from
  OpenAI's API reference and say so.

The server is a subprocess on the full-vocabulary tiny fixture with the real Qwen3 tokenizer.
Registered with CTest by tests/CMakeLists.txt (label `server`):

  python3 tests/server/openai_contract_test.py --vlm BUILD/tools/cli/vlm \\
      --model-dir tests/model/fixtures/tiny-fullvocab-bf16 [unittest args]
"""

import argparse
import base64
import concurrent.futures
import http.client
import json
import shutil
import subprocess
import tempfile
import time
import unittest
from pathlib import Path

import openai

import serve_util
from serve_util import CTX, MODEL, REPO, TIMEOUT, VlmServer, value

ARGS = argparse.Namespace(vlm=None, model_dir=None)
EOS = 151645  # <|im_end|>
KEY = "contract-key"
SMALL_PNG = REPO / "tests/unit/fixtures/images/png_rgb.png"  # 37x23 RGB


def user(content):
    return [{"role": "user", "content": content}]


def data_url(png):
    return "data:image/png;base64," + base64.b64encode(png).decode()


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


class Base(unittest.TestCase):
    server = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="vlm_contract_test_"))
        cls.model_dir = serve_util.make_model_dir(ARGS.model_dir, cls.tmp / "model")
        cls.media_dir = cls.tmp / "media"
        cls.media_dir.mkdir()
        cls.server = VlmServer(ARGS.vlm, cls.model_dir, cls.tmp, "server",
                               ["--allowed-media-path", str(cls.media_dir), "--max-waiting", "6"])

    @classmethod
    def tearDownClass(cls):
        alive = cls.server.proc.poll() is None
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if not alive:
            raise AssertionError(f"vlm serve exited during the tests:\n{cls.server.output()}")

    def client(self, server=None, api_key="x"):
        c = openai.OpenAI(base_url=(server or self.server).url("/v1"), api_key=api_key, max_retries=0,
                          timeout=TIMEOUT)
        self.addCleanup(c.close)
        return c

    def chat(self, messages, **kw):
        kw.setdefault("temperature", 0)
        return self.client().chat.completions.create(model=MODEL, messages=messages, **kw)

    def post(self, path, body, headers=None, server=None):
        """(status, parsed JSON or raw bytes) of a POST sent without the OpenAI client; `body`
        may be bytes (sent as is) or an object (JSON)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn = http.client.HTTPConnection("127.0.0.1", (server or self.server).port, timeout=TIMEOUT)
        try:
            conn.request("POST", path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            r = conn.getresponse()
            raw = r.read()
        finally:
            conn.close()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw

    def get(self, path, headers=None, server=None):
        conn = http.client.HTTPConnection("127.0.0.1", (server or self.server).port, timeout=TIMEOUT)
        try:
            conn.request("GET", path, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def sse(self, path, body):
        """(status, [parsed chunk], terminator seen) of a streamed POST, read raw."""
        status, raw = self.post(path, {**body, "stream": True})
        if status != 200:
            return status, raw, False
        text = raw.decode() if isinstance(raw, bytes) else json.dumps(raw)
        events = [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]
        done = bool(events) and events[-1] == "[DONE]" and text.endswith("data: [DONE]\n\n")
        return status, [json.loads(e) for e in events if e != "[DONE]"], done

    def expect_400(self, path, body, param=None, needle=None, status=400):
        code, err = self.post(path, body)
        self.assertEqual(code, status, f"{body} → {err}")
        self.assertIsInstance(err, dict, err)
        self.assertIn("error", err)
        if param is not None:
            self.assertEqual(err["error"]["param"], param, err)
        if needle is not None:
            self.assertIn(needle, err["error"]["message"])
        return err["error"]

    def tokenize(self, text):
        r = subprocess.run([ARGS.vlm, "tokenize", "-m", str(self.model_dir), "--text", text],
                           capture_output=True, text=True, timeout=TIMEOUT, check=True)
        return json.loads(r.stdout)

    def metrics(self, server=None):
        return serve_util.metrics(server or self.server)[0]

    def greedy(self, text, max_tokens, **kw):
        return self.chat(user(text), max_tokens=max_tokens, extra_body={"ignore_eos": True, **kw}
                         ).choices[0].message.content


class ValidationTest(Base):
    """The rules of the server's own request validation, one test per rule."""

    def test_deep_json_is_400_and_the_server_lives(self):
        deep = "[" * 100000 + "]" * 100000
        for body in (f'{{"messages": {deep}}}',
                     f'{{"messages": [{{"role": "user", "content": {deep}}}]}}',
                     f'{{"messages": [{{"role": "user", "content": "x"}}], "tools": {deep}}}'):
            code, err = self.post("/v1/chat/completions", body.encode())
            self.assertEqual(code, 400, err)
            self.assertIn("deeper than 64", err["error"]["message"])
        code, err = self.post("/v1/completions", f'{{"prompt": {deep}}}'.encode())
        self.assertEqual(code, 400, err)
        self.assertEqual(self.chat(user("still there?"), max_tokens=2).object, "chat.completion")

    def test_huge_min_pixels_is_refused_before_any_pixel_work(self):
        png = SMALL_PNG.read_bytes()
        base_kb = self.server.reset_peak_rss()
        t0 = time.monotonic()
        for extra in ({"min_pixels": 100000000}, {"min_pixels": 1000000000}):
            err = self.expect_400("/v1/chat/completions", {
                "model": MODEL, "max_tokens": 2, **extra,
                "messages": user([image_part(data_url(png)), {"type": "text", "text": "?"}])},
                param="min_pixels")
            self.assertIn("16777216", err["message"])
        # Within the cap but over the context: priced from the header, refused before decoding.
        err = self.expect_400("/v1/chat/completions", {
            "model": MODEL, "max_tokens": 2, "min_pixels": 16777216, "max_pixels": 16777216,
            "messages": user([image_part(data_url(png)), {"type": "text", "text": "?"}])})
        self.assertIn("tokens at the pixel budget", err["message"])
        self.assertLess(time.monotonic() - t0, 5.0)
        rise = (self.server.status_kb("VmHWM") - base_kb) / 1024
        self.assertLess(rise, 64, f"peak RSS rose by {rise:.1f} MiB")

    def test_max_tokens_at_int64_max_is_400_naming_it(self):
        for field in ("max_tokens", "max_completion_tokens"):
            err = self.expect_400("/v1/chat/completions", {
                "model": MODEL, "messages": user("hi"), field: 9223372036854775807})
            self.assertIn("max_tokens", err["message"])
            self.assertIn("9223372036854775807", err["message"])
            self.assertNotIn("-", err["message"].replace("max_tokens", ""))
        err = self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user("hi"),
                                                       "max_tokens": 9223372036854775808},
                              param="max_tokens")

    def test_logprobs_bytes_add_up_to_the_text(self):
        # The stop token is not listed: with <|im_end|> forced first, the reply and its
        # logprobs are both empty.
        r = self.chat(user("hi"), max_tokens=8, logprobs=True, top_logprobs=2,
                      logit_bias={str(EOS): 100})
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.choices[0].message.content, "")
        self.assertEqual(r.choices[0].logprobs.content, [])
        # A stop string: the tokens it takes are not listed; the bytes add up to the text.
        full = self.greedy("Tell me a long story.", 40)
        stop = full[len(full) // 2:len(full) // 2 + 3]
        for stream in (False, True):
            with self.subTest(stream=stream):
                kw = dict(max_tokens=40, logprobs=True, top_logprobs=1, stop=[stop],
                          extra_body={"ignore_eos": True})
                if stream:
                    text, entries = "", []
                    for ch in self.chat(user("Tell me a long story."), stream=True, **kw):
                        for c in ch.choices:
                            text += c.delta.content or ""
                            if c.logprobs and c.logprobs.content:
                                entries += c.logprobs.content
                else:
                    r = self.chat(user("Tell me a long story."), **kw)
                    text, entries = r.choices[0].message.content, r.choices[0].logprobs.content
                self.assertEqual(text, full[:full.find(stop)])
                self.assertEqual(b"".join(bytes(e.bytes) for e in entries), text.encode())

    def test_logit_bias_changes_the_output(self):
        forced = self.tokenize(" banana")[0]
        r = self.chat(user("hi"), max_tokens=6, logit_bias={str(forced): 100},
                      extra_body={"ignore_eos": True}, logprobs=True)
        self.assertEqual([e.token for e in r.choices[0].logprobs.content], [" banana"] * 6)
        greedy = self.chat(user("Count to ten."), max_tokens=6, logprobs=True,
                           extra_body={"ignore_eos": True})
        banned = {str(self.tokenize(e.token)[0]): -100 for e in greedy.choices[0].logprobs.content
                  if e.token and len(self.tokenize(e.token)) == 1}
        self.assertTrue(banned)
        other = self.chat(user("Count to ten."), max_tokens=6, logit_bias=banned,
                          extra_body={"ignore_eos": True})
        self.assertNotEqual(other.choices[0].message.content, greedy.choices[0].message.content)
        self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user("hi"),
                                                 "logit_bias": {"151936": 1}}, param="logit_bias",
                        needle="151936")

    def test_parameters_are_read_or_refused_by_name(self):
        for field, val in (("response_format", {"type": "sound"}),
                           ("response_format", {"type": "json_schema"}),
                           ("reasoning_effort", "high"), ("temprature", 0.1),
                           ("tool_choice", "required"), ("min_tokens", 2)):
            with self.subTest(field=field, value=val):
                self.expect_400("/v1/chat/completions",
                                {"model": MODEL, "messages": user("hi"), field: val}, param=field)
        ok = self.chat(user("hi"), max_tokens=2, user="u1", store=False, metadata={"a": "b"},
                       service_tier="auto", response_format={"type": "text"})
        self.assertEqual(ok.object, "chat.completion")
        self.expect_400("/v1/completions", {"model": MODEL, "prompt": "hi", "response_format": {"type": "text"}},
                        param="response_format")

    def test_stream_options_need_stream(self):
        for path, body in (("/v1/chat/completions", {"messages": user("hi")}),
                           ("/v1/completions", {"prompt": "hi"})):
            for stream in (None, False):
                b = {"model": MODEL, **body, "stream_options": {"include_usage": True}}
                if stream is not None:
                    b["stream"] = stream
                self.expect_400(path, b, param="stream_options")

    def test_errors_reveal_no_server_path_nor_file_contents(self):
        secret = self.media_dir / "notes.png"
        secret.write_text("TOP-SECRET first bytes of a text file\n")
        err = self.expect_400("/v1/chat/completions", {
            "model": MODEL, "max_tokens": 2,
            "messages": user([image_part(secret.as_uri()), {"type": "text", "text": "?"}])})
        for leak in (str(self.media_dir), str(self.tmp), "TOP-SECRET", "54 4f 50", "544f50"):
            self.assertNotIn(leak, err["message"])
        self.assertIn("image 1", err["message"])
        err = self.expect_400("/v1/chat/completions", {
            "model": MODEL, "max_tokens": 2,
            "messages": user([image_part((self.media_dir / "missing.png").as_uri())])})
        self.assertNotIn(str(self.media_dir), err["message"].replace((self.media_dir / "missing.png").as_uri(), ""))

    def test_n_beyond_the_queue_is_400_not_429(self):
        # This server queues 6 (--max-waiting 6): n 7 can never be admitted, even when idle.
        err = self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user("hi"), "n": 7},
                              param="n")
        self.assertIn("--max-waiting", err["message"])
        self.expect_400("/v1/completions", {"model": MODEL, "prompt": ["a", "b", "c", "d"], "n": 2}, param="n")
        self.assertEqual(len(self.chat(user("hi"), n=6, max_tokens=2).choices), 6)


class PeerContractTest(Base):
    """Cases ported from llama.cpp's tools/server/tests/unit and vLLM's tests/entrypoints/openai
    (each docstring names the original); the code is ours."""

    # ----- health, models, metrics -----

    def test_health(self):
        """llama.cpp test_basic.py::test_server_start_simple; vLLM basic/test_basic.py::test_check_health"""
        self.assertEqual(self.get("/health")[0], 200)

    def test_models_list(self):
        """llama.cpp test_basic.py::test_server_models; vLLM models/test_models.py::test_check_models"""
        models = self.client().models.list()
        self.assertEqual(len(models.data), 1)
        self.assertEqual(models.data[0].id, MODEL)
        self.assertEqual(models.data[0].object, "model")
        self.assertIsInstance(models.data[0].created, int)

    def test_metrics_count_tokens_and_requests(self):
        """vLLM test_metrics.py::test_metrics_counts (10 token-id completions of 10 tokens)"""
        prompt = self.tokenize("Hello, my name is")
        m0 = self.metrics()
        for _ in range(10):
            self.client().completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0,
                                             extra_body={"ignore_eos": True})
        m1 = self.metrics()
        self.assertEqual(value(m1, "vlm_prompt_tokens_total") - value(m0, "vlm_prompt_tokens_total"), 10 * len(prompt))
        self.assertEqual(value(m1, "vlm_generation_tokens_total") - value(m0, "vlm_generation_tokens_total"), 100)
        self.assertEqual(value(m1, "vlm_requests_total", outcome="ok") -
                         value(m0, "vlm_requests_total", outcome="ok"), 10)

    # ----- chat basics and validation -----

    def test_chat_basics(self):
        """llama.cpp test_chat_completion.py::test_chat_completion"""
        for content in ("Write a joke.", [{"type": "text", "text": "Write a joke."}]):
            r = self.chat([{"role": "system", "content": "You are a poet."}, {"role": "user", "content": content}],
                          max_tokens=8, extra_body={"ignore_eos": True})
            self.assertTrue(r.id.startswith("chatcmpl-"))
            self.assertEqual(r.object, "chat.completion")
            self.assertEqual(r.choices[0].message.role, "assistant")
            self.assertEqual(r.choices[0].finish_reason, "length")
            self.assertEqual(r.usage.completion_tokens, 8)
            self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 8)

    def test_max_completion_tokens_and_a_second_turn(self):
        """vLLM chat_completion/test_chat.py::test_single_chat_session"""
        msgs = user("What is the capital of France?")
        r = self.chat(msgs, max_completion_tokens=5, logprobs=True, top_logprobs=5,
                      extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 5)
        self.assertEqual(len(r.choices[0].logprobs.content[0].top_logprobs), 5)
        msgs = msgs + [{"role": "assistant", "content": r.choices[0].message.content},
                       {"role": "user", "content": "And of Italy?"}]
        r2 = self.chat(msgs, max_completion_tokens=5)
        self.assertGreater(r2.usage.prompt_tokens, r.usage.prompt_tokens)

    def test_text_as_string_or_parts_is_the_same_prompt(self):
        """vLLM chat_completion/test_chat.py::test_complex_message_content"""
        a = self.chat(user("Describe the sea."), max_tokens=8, seed=0)
        b = self.chat(user([{"type": "text", "text": "Describe the sea."}]), max_tokens=8, seed=0)
        self.assertEqual(a.choices[0].message.content, b.choices[0].message.content)
        self.assertEqual(a.usage.prompt_tokens, b.usage.prompt_tokens)

    def test_extra_fields_in_messages_are_allowed(self):
        """vLLM chat_completion/test_chat.py::test_extra_fields_allowed"""
        r = self.chat([{"role": "user", "content": "hi", "extra_field": "0"}], max_tokens=2)
        self.assertEqual(r.object, "chat.completion")

    def test_invalid_messages_are_400(self):
        """llama.cpp test_chat_completion.py::test_invalid_chat_completion_req (400, not 500)"""
        for msgs in (None, "string", [123], [{}], [{"role": 123}], [{"role": "system", "content": 123}],
                     [{"role": "user", "content": "x"}, {}], []):
            with self.subTest(messages=msgs):
                self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": msgs})

    def test_non_object_bodies_are_400(self):
        """vLLM chat_completion/test_non_object_body_validation.py::
        test_chat_completion_request_rejects_non_object_body"""
        for raw in (b"{not json", b"[]", b"42", b"null", b'"text"'):
            code, err = self.post("/v1/chat/completions", raw)
            self.assertEqual(code, 400, raw)
            self.assertIn("error", err)

    def test_context_exceeded_is_400_also_for_streams(self):
        """llama.cpp test_chat_completion.py::test_context_size_exceeded and
        test_context_size_exceeded_stream (refused before the stream starts)"""
        long = "hello " * 1000
        for stream in (False, True):
            err = self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user(long), "stream": stream})
            self.assertIn("context", err["message"])

    def test_completion_prompt_too_long_is_400(self):
        """llama.cpp test_ctx_shift.py::test_ctx_shift_disabled_long_prompt"""
        self.expect_400("/v1/completions", {"model": MODEL, "prompt": "hello " * 1000})
        self.expect_400("/v1/completions", {"model": MODEL, "prompt": [9707] * (CTX + 10)})

    def test_openai_library_with_seed_and_temperature(self):
        """llama.cpp test_chat_completion.py::test_chat_completion_with_openai_library"""
        r = self.chat(user("What is the best book?"), max_tokens=8, seed=42, temperature=0.8,
                      extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertIsNotNone(r.choices[0].message.content)

    # ----- streaming -----

    def test_stream_shape(self):
        """llama.cpp test_chat_completion.py::test_chat_completion_stream"""
        status, chunks, done = self.sse("/v1/chat/completions", {
            "model": MODEL, "messages": user("Tell me a story."), "max_tokens": 8, "ignore_eos": True,
            "stream_options": {"include_usage": True}})
        self.assertEqual(status, 200)
        self.assertTrue(done)
        self.assertEqual(chunks[0]["choices"][0]["delta"].get("role"), "assistant")
        self.assertEqual(len({c["id"] for c in chunks}), 1)
        self.assertTrue(all(c["object"] == "chat.completion.chunk" for c in chunks))
        self.assertTrue(all("role" not in c["choices"][0]["delta"] for c in chunks[1:] if c["choices"]))
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], 8)
        self.assertTrue(all(c.get("usage") is None for c in chunks[:-1]))

    def test_stream_equals_plain(self):
        """vLLM chat_completion/test_chat.py::test_chat_streaming"""
        plain = self.chat(user("Say something."), max_tokens=12)
        text, finishes = "", []
        for ch in self.chat(user("Say something."), max_tokens=12, stream=True):
            for c in ch.choices:
                text += c.delta.content or ""
                if c.finish_reason:
                    finishes.append(c.finish_reason)
        self.assertEqual(text, plain.choices[0].message.content)
        self.assertEqual(finishes, [plain.choices[0].finish_reason])

    def test_stream_options_matrix(self):
        """vLLM chat_completion/test_chat.py::test_chat_completion_stream_options and
        completion/test_completion.py::test_completion_stream_options"""
        for path, body in (("/v1/chat/completions", {"messages": user("hi")}), ("/v1/completions", {"prompt": "hi"})):
            base = {"model": MODEL, **body, "max_tokens": 4, "ignore_eos": True}
            for opts, usage_last in (({"include_usage": False}, False), ({}, False), ({"include_usage": True}, True)):
                status, chunks, done = self.sse(path, {**base, "stream_options": opts})
                self.assertEqual(status, 200)
                self.assertTrue(done)
                usages = [c for c in chunks if c.get("usage")]
                if usage_last:
                    self.assertEqual(len(usages), 1)
                    self.assertIs(usages[0], chunks[-1])
                    u = usages[0]["usage"]
                    self.assertEqual(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"])
                    self.assertEqual(u["completion_tokens"], 4)
                else:
                    self.assertEqual(usages, [])
            self.expect_400(path, {**base, "stream": False, "stream_options": {"include_usage": True}})

    def test_completion_stream_equals_plain(self):
        """vLLM completion/test_completion.py::test_completion_streaming; llama.cpp
        test_completion.py::test_completion_stream_with_openai_library"""
        c = self.client()
        plain = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0,
                                     extra_body={"ignore_eos": True})
        text, finishes = "", []
        for ch in c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True}):
            text += ch.choices[0].text
            if ch.choices[0].finish_reason:
                finishes.append(ch.choices[0].finish_reason)
        self.assertEqual(text, plain.choices[0].text)
        self.assertEqual(finishes, ["length"])

    # ----- n, batches, token ids -----

    def test_n_choices_are_indexed(self):
        """llama.cpp test_chat_completion.py::test_chat_completions_multiple_choices; vLLM
        chat_completion/test_chat.py::test_chat_completion_n_parameter_non_streaming"""
        r = self.chat(user("Name a colour."), n=3, max_tokens=16, temperature=0.9,
                      extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        self.assertTrue(all(c.finish_reason == "length" for c in r.choices))
        self.assertGreater(len({c.message.content for c in r.choices}), 1)

    def test_n_stream_one_finish_per_choice(self):
        """vLLM chat_completion/test_chat.py::test_chat_completion_n_parameter_streaming"""
        texts, finishes = {}, {}
        for ch in self.chat(user("Name a colour."), n=2, max_tokens=6, stream=True, temperature=0.9):
            for c in ch.choices:
                texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
                if c.finish_reason:
                    finishes[c.index] = finishes.get(c.index, 0) + 1
        self.assertEqual(sorted(texts), [0, 1])
        self.assertEqual(finishes, {0: 1, 1: 1})

    def test_seeded_n_repeats(self):
        """vLLM chat_completion/test_chat.py::test_chat_completion_n_with_seed"""
        a = self.chat(user("Pick a number."), n=2, seed=42, temperature=1.0, max_tokens=8)
        b = self.chat(user("Pick a number."), n=2, seed=42, temperature=1.0, max_tokens=8)
        self.assertEqual([c.message.content for c in a.choices], [c.message.content for c in b.choices])

    def test_batched_prompts(self):
        """vLLM completion/test_completion.py::test_batch_completions"""
        c = self.client()
        ids = self.tokenize("Hello, my name is")
        for prompt in (["Hello, my name is"] * 2, [ids, ids]):
            r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0)
            self.assertEqual(len(r.choices), 2)
            self.assertEqual(r.choices[0].text, r.choices[1].text)

    def test_token_id_prompt_equals_text_prompt(self):
        """llama.cpp test_completion.py::test_completion_with_tokens_input; vLLM
        completion/test_completion.py::test_single_completion"""
        c = self.client()
        text = "What is the capital of France?"
        ids = self.tokenize(text)
        a = c.completions.create(model=MODEL, prompt=text, max_tokens=5, temperature=0)
        b = c.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0)
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        self.assertEqual(b.usage.prompt_tokens, len(ids))

    def test_bad_token_id_prompts_are_400(self):
        """vLLM completion/test_prompt_validation.py::test_out_of_vocab_token_ids,
        completion/test_completion_error.py::test_negative_prompt_token_ids_flat / _nested,
        completion/test_empty_prompt_list.py::test_empty_prompt_list_rejected"""
        for prompt in ([999999], [-1], [[-1]], [], "", [[]]):
            with self.subTest(prompt=prompt):
                self.expect_400("/v1/completions", {"model": MODEL, "prompt": prompt})

    # ----- logprobs -----

    def test_chat_logprobs_shapes(self):
        """vLLM chat_completion/test_chat.py::test_no_logprobs_chat, test_zero_logprobs_chat,
        test_some_logprobs_chat"""
        r = self.chat(user("hi"), max_tokens=4, extra_body={"ignore_eos": True})
        self.assertIsNone(r.choices[0].logprobs)
        for k in (0, 5):
            r = self.chat(user("hi"), max_tokens=4, logprobs=True, top_logprobs=k, extra_body={"ignore_eos": True})
            self.assertEqual(len(r.choices[0].logprobs.content), r.usage.completion_tokens)
            self.assertTrue(all(len(e.top_logprobs) == k for e in r.choices[0].logprobs.content))

    def test_too_many_logprobs_are_400(self):
        """vLLM chat_completion/test_chat.py::test_too_many_chat_logprobs and
        completion/test_completion.py::test_too_many_completion_logprobs"""
        for stream in (False, True):
            self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user("hi"), "logprobs": True,
                                                     "top_logprobs": 21, "stream": stream})
            self.expect_400("/v1/completions", {"model": MODEL, "prompt": "hi", "logprobs": 21, "stream": stream})
        self.assertEqual(self.chat(user("hi"), max_tokens=2).object, "chat.completion")

    def test_logprob_entries(self):
        """llama.cpp test_chat_completion.py::test_logprobs"""
        r = self.chat(user("Tell me something."), max_tokens=8, logprobs=True, top_logprobs=10)
        content = r.choices[0].message.content
        entries = r.choices[0].logprobs.content
        self.assertEqual("".join(e.token for e in entries), content)
        for e in entries:
            self.assertLessEqual(e.logprob, 0.0)
            self.assertTrue(e.top_logprobs)
            self.assertAlmostEqual(e.logprob, e.top_logprobs[0].logprob, delta=1e-4)  # greedy

    def test_streamed_logprobs(self):
        """llama.cpp test_chat_completion.py::test_logprobs_stream"""
        text, tokens = "", ""
        for ch in self.chat(user("Tell me something."), max_tokens=8, logprobs=True, top_logprobs=1, stream=True):
            for c in ch.choices:
                text += c.delta.content or ""
                if c.logprobs and c.logprobs.content:
                    tokens += "".join(e.token for e in c.logprobs.content)
        self.assertEqual(tokens, text)

    def test_text_offset_stream_equals_plain_with_a_stop_holdback(self):
        """vLLM completion/test_completion_text_offset.py::
        test_stream_text_offset_matches_non_stream_with_stop_holdback"""
        c = self.client()
        full = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0,
                                    extra_body={"ignore_eos": True}).choices[0].text
        stop = full[len(full) // 2:len(full) // 2 + 2]
        kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0, logprobs=1, stop=[stop],
                  extra_body={"ignore_eos": True})
        plain = c.completions.create(**kw).choices[0]
        offsets, tokens = [], []
        for ch in c.completions.create(stream=True, **kw):
            lp = ch.choices[0].logprobs
            if lp and lp.text_offset:
                offsets += lp.text_offset
                tokens += lp.tokens
        self.assertEqual(offsets, plain.logprobs.text_offset)
        self.assertEqual("".join(tokens), plain.text)

    # ----- sampling -----

    def test_same_seed_same_result(self):
        """llama.cpp test_completion.py::test_consistent_result_same_seed; vLLM
        tests/v1/sample/test_sampling_params_e2e.py::test_seed"""
        outs = {self.chat(user("Tell me a story."), max_tokens=12, seed=42, temperature=1.0).choices[0].message.content
                for _ in range(3)}
        self.assertEqual(len(outs), 1)

    def test_different_seeds_differ(self):
        """llama.cpp test_completion.py::test_different_result_different_seed"""
        outs = [self.chat(user("Tell me a story."), max_tokens=16, seed=s, temperature=1.0,
                          extra_body={"ignore_eos": True}).choices[0].message.content for s in range(4)]
        self.assertGreater(len(set(outs)), 1)

    def test_penalties_and_filters_together(self):
        """vLLM tests/v1/sample/test_sampling_params_e2e.py::test_penalties"""
        r = self.chat(user("hi"), max_tokens=8, temperature=1.2, presence_penalty=1.2, frequency_penalty=1.2,
                      top_p=0.5, extra_body={"repetition_penalty": 1.2, "min_p": 0.5, "top_k": 3})
        self.assertEqual(r.object, "chat.completion")

    def test_stop_strings_are_excluded(self):
        """vLLM tests/v1/sample/test_sampling_params_e2e.py::test_stop; llama.cpp
        test_completion.py::test_completion_stream_with_openai_library_stops"""
        full = self.greedy("Write a poem.", 24)
        stop = full[len(full) // 3:len(full) // 3 + 3]
        r = self.chat(user("Write a poem."), max_tokens=24, stop=[stop], extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].message.content, full[:full.find(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_ignore_eos_always_reaches_max_tokens(self):
        """llama.cpp test_ignore_eos.py::test_ignore_eos_populates_logit_bias"""
        for seed in range(3):
            r = self.chat(user("hi"), max_tokens=6, seed=seed, temperature=1.0,
                          logit_bias={str(EOS): 10}, extra_body={"ignore_eos": True})
            self.assertEqual(r.usage.completion_tokens, 6)
            self.assertEqual(r.choices[0].finish_reason, "length")

    def test_logit_bias_validation(self):
        """vLLM chat_completion/test_chat_logit_bias_validation.py::test_chat_logit_bias_valid,
        _invalid, _non_integer_key, _non_numeric_value, _multiple_non_integer_keys"""
        self.assertEqual(self.chat(user("hi"), max_tokens=2, logit_bias={"151935": 1}).object, "chat.completion")
        self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user("hi"), "logit_bias": {"151937": 1}},
                        needle="151937")
        self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user("hi"),
                                                 "logit_bias": {"not_a_token_id": 1}}, needle="logit_bias")
        self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user("hi"),
                                                 "logit_bias": {"5": "not_a_number"}}, param="logit_bias")
        err = self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user("hi"),
                                                       "logit_bias": {"bad1": 1, "bad2": 1}})
        self.assertIn("bad1", err["message"])
        self.assertIn("bad2", err["message"])

    def test_seed_outside_int64_is_400(self):
        """vLLM chat_completion/test_chat.py::test_long_seed"""
        for seed in (-(2 ** 63) - 1, 2 ** 64):
            self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user("hi"), "seed": seed},
                            param="seed")

    def test_response_format(self):
        """vLLM chat_completion/test_chat.py::test_response_format_text; llama.cpp
        test_chat_completion.py::test_completion_with_response_format; vLLM
        chat_completion/test_chat_error.py::test_json_schema_response_format_missing_schema"""
        self.assertEqual(self.chat(user("hi"), max_tokens=2, response_format={"type": "text"}).object, "chat.completion")
        for rf in ({"type": "sound"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {}}):
            self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user("hi"), "response_format": rf},
                            param="response_format")

    # ----- API key -----

    def test_api_key(self):
        """llama.cpp test_security.py::test_access_public_endpoint, test_incorrect_api_key,
        test_correct_api_key, test_openai_library_correct_api_key; vLLM
        embedding_tests/test_optional_middleware.py::test_missing_api_token, test_passed_api_token,
        test_not_v1_api_token, test_no_api_token"""
        keyed = VlmServer(ARGS.vlm, self.model_dir, self.tmp, "keyed", ["--api-key", KEY])
        try:
            self.assertEqual(self.get("/health", server=keyed)[0], 200)
            self.assertEqual(self.get("/metrics", server=keyed)[0], 200)
            self.assertEqual(self.get("/v1/models", server=keyed)[0], 401)
            self.assertEqual(self.get("/v1/models", {"Authorization": f"Bearer {KEY}"}, server=keyed)[0], 200)
            for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                               ("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2})):
                for headers in ({}, {"Authorization": "Bearer invalid-key"}):
                    code, err = self.post(path, {"model": MODEL, **body}, headers, server=keyed)
                    self.assertEqual(code, 401)
                    self.assertEqual(err["error"]["type"], "authentication_error")
            r = self.client(keyed, api_key=KEY).chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=2)
            self.assertEqual(len(r.choices), 1)
            self.assertEqual(self.get("/v1/models")[0], 200)  # no key configured: open
        finally:
            keyed.stop()

    # ----- images -----

    def test_data_url_and_file_url_give_the_same_reply(self):
        """vLLM chat_completion/test_vision.py::test_single_chat_session_image_base64encoded"""
        png = SMALL_PNG.read_bytes()
        path = self.media_dir / "small.png"
        path.write_bytes(png)
        replies = []
        for url in (data_url(png), path.as_uri()):
            r = self.chat(user([image_part(url), {"type": "text", "text": "What is this?"}]), max_tokens=6)
            replies.append((r.usage.prompt_tokens, r.choices[0].message.content))
        self.assertEqual(replies[0], replies[1])

    def test_image_stream_equals_plain(self):
        """vLLM chat_completion/test_vision.py::test_chat_streaming_image"""
        msgs = user([image_part(data_url(SMALL_PNG.read_bytes())), {"type": "text", "text": "Describe."}])
        plain = self.chat(msgs, max_tokens=8)
        text = "".join(c.delta.content or "" for ch in self.chat(msgs, max_tokens=8, stream=True) for c in ch.choices)
        self.assertEqual(text, plain.choices[0].message.content)

    def test_malformed_image_urls_are_400(self):
        """llama.cpp test_vision_api.py::test_vision_chat_completion (malformed inputs)"""
        for url in ("malformed", "data:image/png;base64,@@@", "data:image/png;base64,AAAA"):
            self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user([image_part(url)])})

    # ----- robustness -----

    def test_cancelled_requests_leave_the_server_serving(self):
        """vLLM basic/test_basic.py::test_request_cancellation (scaled down)"""
        def abandon(i):
            c = openai.OpenAI(base_url=self.server.url("/v1"), api_key="x", max_retries=0, timeout=0.3)
            try:
                c.chat.completions.create(model=MODEL, messages=user(f"Go on {i}."), max_tokens=400,
                                          extra_body={"ignore_eos": True})
            except openai.APITimeoutError:
                pass
            finally:
                c.close()
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            list(pool.map(abandon, range(6)))
        t0 = time.monotonic()
        self.assertEqual(self.chat(user("hi"), max_tokens=2).object, "chat.completion")
        self.assertLess(time.monotonic() - t0, 10)
        deadline = time.monotonic() + 20
        while value(self.metrics(), "vlm_num_requests_running") != 0:
            self.assertLess(time.monotonic(), deadline, "abandoned requests kept running")
            time.sleep(0.05)

    # ----- from OpenAI's API reference (no peer test covers these) -----

    def test_reference_ranges(self):
        """OpenAI API reference: n >= 1, max_tokens >= 1, temperature in [0, 2], top_p in (0, 1],
        penalties in [-2, 2], top_logprobs needs logprobs, at most 4 stop sequences, suffix is
        not served, an unknown model is 404"""
        cases = [({"n": 0}, "n"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": -1}, "max_tokens"),
                 ({"temperature": -0.5}, "temperature"), ({"temperature": 2.5}, "temperature"),
                 ({"top_p": 0}, "top_p"), ({"presence_penalty": 3}, "presence_penalty"),
                 ({"top_logprobs": 2}, "top_logprobs"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop")]
        for extra, param in cases:
            with self.subTest(extra=extra):
                self.expect_400("/v1/chat/completions", {"model": MODEL, "messages": user("hi"), **extra}, param=param)
        self.expect_400("/v1/completions", {"model": MODEL, "prompt": "hi", "suffix": "x"}, param="suffix")
        self.expect_400("/v1/chat/completions", {"model": "nope", "messages": user("hi")}, param="model", status=404)

    def test_emoji_stream_is_valid_utf8(self):
        """OpenAI API reference (stream deltas are text); the nearest peer case is llama.cpp
        test_tokenize.py::test_tokenize_with_pieces (a prompt with emoji)"""
        prompt = "unicode 媽 and emoji 🤗 — " * 2
        byte_tokens = [t for t in self.tokenize("🤗") if t != 11162][:1] or [97]
        kw = dict(max_tokens=10, logit_bias={str(byte_tokens[0]): 5}, extra_body={"ignore_eos": True})
        plain = self.chat(user(prompt), **kw).choices[0].message.content
        deltas = [c.delta.content or "" for ch in self.chat(user(prompt), stream=True, **kw) for c in ch.choices]
        self.assertEqual("".join(deltas), plain)
        for d in deltas:
            d.encode("utf-8")  # every delta is whole characters


class TokenizerEndpointTest(Base):
    """vLLM's /tokenize and /detokenize (vllm-project/vllm, tests/entrypoints/openai/
    test_tokenization.py: test_tokenize_completions, test_tokenize_chat, test_detokenize), and the
    last contract details: a schema beside json_object, top_logprobs 0, system_fingerprint."""

    def test_tokenize_a_prompt_as_the_tokenizer_does(self):
        """vLLM test_tokenize_completions: tokens, count, max_model_len; token_strs on request"""
        text = "Hello, 世界 🤗 <|im_start|>"
        code, r = self.post("/tokenize", {"model": MODEL, "prompt": text})
        self.assertEqual(code, 200, r)
        self.assertEqual(r["tokens"], self.tokenize(text))
        self.assertEqual(r["count"], len(r["tokens"]))
        models = json.loads(self.get("/v1/models")[1])
        self.assertEqual(r["max_model_len"], models["data"][0]["max_model_len"])
        self.assertIsNone(r["token_strs"])
        code, r2 = self.post("/tokenize", {"prompt": text, "add_special_tokens": False,
                                           "return_token_strs": True})
        self.assertEqual(code, 200, r2)
        self.assertEqual(r2["tokens"], r["tokens"])
        self.assertEqual(len(r2["token_strs"]), r2["count"])
        self.assertIn("<|im_start|>", r2["token_strs"])
        # Longer than the context: refused, as a completion of it would be.
        self.expect_400("/tokenize", {"prompt": "hi " * (2 * r["max_model_len"])}, param="prompt")

    def test_tokenize_a_chat_counts_what_the_completion_counts(self):
        """vLLM test_tokenize_chat (with add_generation_prompt both ways), and an image counted as
        its tokens: the count equals the completion's usage.prompt_tokens, also with the
        request's min_pixels / max_pixels"""
        png = SMALL_PNG.read_bytes()
        convs = [user("hi there"),
                 user([{"type": "text", "text": "what is this?"}, image_part(data_url(png))]),
                 user([image_part(data_url(png)), {"type": "text", "text": "and"},
                       image_part(data_url(png))])]
        for messages in convs:
            for extra in ({}, {"max_pixels": 16 * 16 * 4}):
                with self.subTest(parts=len(messages[0]["content"]), extra=extra):
                    code, t = self.post("/tokenize", {"model": MODEL, "messages": messages, **extra})
                    self.assertEqual(code, 200, t)
                    reply = self.chat(messages, max_tokens=1, extra_body=extra)
                    self.assertEqual(t["count"], reply.usage.prompt_tokens)
                    self.assertEqual(len(t["tokens"]), t["count"])
            code, bare = self.post("/tokenize", {"messages": messages, "add_generation_prompt": False})
            self.assertEqual(code, 200, bare)
            # The generation prompt is "<|im_start|>assistant\n": a few tokens more.
            self.assertEqual(t["tokens"][:bare["count"]], bare["tokens"])
            self.assertGreater(t["count"], bare["count"])
            # The chat completion takes add_generation_prompt too (vLLM's), and counts the same.
            reply = self.chat(messages, max_tokens=1, extra_body={"add_generation_prompt": False})
            self.assertEqual(reply.usage.prompt_tokens, bare["count"])
        # Two images take twice one image's pads.
        pads = [sum(1 for x in self.post("/tokenize", {"messages": c})[1]["tokens"] if x == 151655)
                for c in convs]
        self.assertEqual(pads[0], 0)
        self.assertGreater(pads[1], 0)
        self.assertEqual(pads[2], 2 * pads[1])

    def test_detokenize_inverts_tokenize(self):
        """vLLM test_detokenize"""
        text = "The quick brown 狐狸 jumps 🤗"
        code, r = self.post("/detokenize", {"model": MODEL, "tokens": self.tokenize(text)})
        self.assertEqual(code, 200, r)
        self.assertEqual(r, {"prompt": text})

    def test_bad_tokenizer_requests_are_refused_by_name(self):
        for path, body, param in [
                ("/tokenize", {}, "prompt"),
                ("/tokenize", {"prompt": "a", "messages": user("a")}, "messages"),
                ("/tokenize", {"prompt": 3}, "prompt"),
                ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
                ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, "add_generation_prompt"),
                ("/tokenize", {"prompt": "a", "bogus": 1}, "bogus"),
                ("/tokenize", {"messages": "hi"}, "messages"),
                ("/detokenize", {"tokens": [1, -1]}, "tokens"),
                ("/detokenize", {"tokens": [10 ** 9]}, "tokens"),
                ("/detokenize", {"tokens": ["a"]}, "tokens"),
                ("/detokenize", {"prompt": "a"}, "prompt")]:
            with self.subTest(path=path, body=body):
                self.expect_400(path, body, param=param)
        self.expect_400("/tokenize", {"model": "nope", "prompt": "a"}, param="model", status=404)
        self.expect_400("/detokenize", {"model": "nope", "tokens": [1]}, param="model", status=404)

    def test_a_schema_beside_json_object_is_used_or_refused(self):
        """OpenAI's json_object takes no schema; one given beside it is enforced, never ignored;
        one that is invalid, or not of an object, is a 400"""
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}
        r = self.chat(user("answer"), max_tokens=48,
                      response_format={"type": "json_object", "schema": schema})
        self.assertEqual(r.choices[0].finish_reason, "stop", r.choices[0].message.content)
        out = json.loads(r.choices[0].message.content)
        self.assertEqual(set(out), {"ok"})
        self.assertIsInstance(out["ok"], bool)
        for bad in [{"type": "object", "properties": 12}, {"type": "string"}, True, "not a schema", [1]]:
            with self.subTest(schema=bad):
                code, err = self.post("/v1/chat/completions", {
                    "model": MODEL, "messages": user("x"), "max_tokens": 4,
                    "response_format": {"type": "json_object", "schema": bad}})
                self.assertEqual(code, 400, err)

    def test_top_logprobs_zero_still_gives_the_sampled_tokens_logprob(self):
        """OpenAI API reference: logprobs true with top_logprobs 0 returns each sampled token's
        logprob and empty top_logprobs"""
        r = self.chat(user("hi"), max_tokens=4, logprobs=True, top_logprobs=0,
                      extra_body={"ignore_eos": True})
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), 4)
        for e in content:
            self.assertLessEqual(e.logprob, 0.0)
            self.assertEqual(e.top_logprobs, [])
        self.assertEqual("".join(e.token for e in content), r.choices[0].message.content)

    def test_replies_carry_a_system_fingerprint(self):
        """OpenAI API reference: system_fingerprint names the backend configuration; the same for
        every reply of one server, in plain and streamed replies of both endpoints"""
        fps = {self.chat(user("a"), max_tokens=1).system_fingerprint,
               self.chat(user("b"), max_tokens=2).system_fingerprint,
               self.client().completions.create(model=MODEL, prompt="x", max_tokens=1).system_fingerprint}
        _, chunks, _ = self.sse("/v1/chat/completions", {"model": MODEL, "messages": user("c"),
                                                         "max_tokens": 2})
        fps |= {c["system_fingerprint"] for c in chunks}
        self.assertEqual(len(fps), 1, fps)
        self.assertRegex(fps.pop(), r"^fp_[0-9a-f]{16}$")


def main():
    serve_util.run_tests(ARGS, __doc__)

if __name__ == "__main__":
    main()
