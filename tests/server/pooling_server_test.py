#!/usr/bin/env python3
"""`vlm serve --task embed|rerank`: embeddings, scores and reranking end to end, against the
references of scripts/make_pooling_server_reference.py (transformers, the models' own prompts,
media limits and pooling; tests/model/fixtures/pooling-server/reference.json).

The model is the full-vocabulary tiny fixture with the real tokenizer, laid out as the published
checkpoints are:
- EmbedTest: Qwen3-VL-Embedding's layout, a sentence-transformers model pooling the last token
  (modules.json, 1_Pooling/config.json, 2_Normalize), served with no --task: detected. Text,
  image, video (as frames), mixed and empty inputs, through `input` and vLLM's `messages`;
  cosine >= 0.99999 and every value within 1e-4 (relative to the vector's largest) of the
  reference; the prompt's token count in usage. The OpenAI client's embeddings.create (its
  default base64 and float), Matryoshka `dimensions`, token-id inputs, `normalize` false,
  concurrent requests batched together, /v1/score and /v1/rerank by cosine similarity, the
  errors, the metrics.
- RerankTest: Qwen3-VL-Reranker's layout (a plain Qwen3-VL checkpoint, which says nothing of
  reranking) with --task rerank. /v1/rerank through `requests` with text, image, mixed and video
  documents, an image query and an instruction: scores within 1e-4 of the reference, sorted,
  top_n, return_documents; /v1/score in its four field spellings, 1:N and N:N, use_activation
  false (the logit); /rerank and /v2/rerank; the errors.
- A text that begins with <|im_start|> is a whole prompt already (what vLLM's clients of Qwen
  embedders and rerankers send): pooled as it is, and equal to the reference.
- TaskTest: a generating server refuses the pooling routes; a sentence-transformers checkpoint
  pooling otherwise than by the last token, and --task embed on a bad value, fail clearly.
Cases after vLLM's tests of its embedding, score and rerank endpoints (tests/entrypoints/pooling:
input forms and batches, base64, dimensions, 1:1 / 1:N / N:N and their length errors, top_n,
use_activation), written for this model.

  python3 tests/server/pooling_server_test.py --vlm BUILD/tools/cli/vlm \\
      --model-dir tests/model/fixtures/tiny-fullvocab-bf16 [unittest args]
"""

import argparse
import base64
import concurrent.futures
import json
import math
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

import numpy as np
import openai
import requests

import serve_util
from serve_util import MODEL, REPO

ARGS = argparse.Namespace(vlm=None, model_dir=None)
FIXTURE = REPO / "tests/model/fixtures/pooling-server"
REF = json.loads((FIXTURE / "reference.json").read_text())
EMBED = {c["name"]: c for c in REF["embed"]}
EMBED_DEFAULT = "Represent the user's input."
TIMEOUT = 60
# f32 arithmetic and KV cache (a BF16 checkpoint's defaults round the cache to BF16), as the
# reference computes.
EXACT = ("--precision", "f32", "--kv-cache-dtype", "f32")


def data_url(name):
    return "data:image/png;base64," + base64.b64encode((FIXTURE / name).read_bytes()).decode()


def content_parts(side):
    """A case's input as chat content parts (videos as qwen-vl-utils' list of frames)."""
    parts = [{"type": "video", "video": [data_url(f) for f in v]} for v in side.get("videos", [])]
    parts += [{"type": "image_url", "image_url": {"url": data_url(i)}}
              for i in side.get("images", [])]
    if side.get("text"):
        parts.append({"type": "text", "text": side["text"]})
    return parts


def messages_of(case):
    msgs = []
    if case.get("instruction"):
        msgs.append({"role": "system", "content": case["instruction"]})
    msgs.append({"role": "user", "content": content_parts(case) or ""})
    return msgs


def normalized(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def st_layout(dest, mode="lasttoken"):
    """sentence-transformers' files, as Qwen3-VL-Embedding publishes them."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (dest / "modules.json").write_text(json.dumps(modules))
    (dest / "1_Pooling").mkdir()
    (dest / "2_Normalize").mkdir()
    modes = {k: k == mode for k in ("cls_token", "mean_tokens", "max_tokens", "lasttoken")}
    (dest / "1_Pooling/config.json").write_text(json.dumps(
        {"word_embedding_dimension": 16, **{f"pooling_mode_{k}": v for k, v in modes.items()},
         "include_prompt": True}))


class Base(unittest.TestCase):
    task_args = ()
    layout = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="vlm-pooling-"))
        model_dir = serve_util.make_model_dir(ARGS.model_dir, cls.tmp / "model")
        if cls.layout:
            cls.layout(model_dir)
        cls.server = serve_util.VlmServer(ARGS.vlm, model_dir, cls.tmp, "serve",
                                          extra_args=["--max-num-seqs", "8", *EXACT,
                                                      *cls.task_args],
                                          ctx=1024)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def post(self, path, body):
        return requests.post(self.server.url(path), json=body, timeout=TIMEOUT)

    def ok(self, path, body):
        r = self.post(path, body)
        self.assertEqual(r.status_code, 200, r.text)
        return r.json()

    def error(self, path, body, status=400, param=None, says=None):
        r = self.post(path, body)
        self.assertEqual(r.status_code, status, r.text)
        err = r.json()["error"]
        if param is not None:
            self.assertEqual(err["param"], param, err)
        if says is not None:
            self.assertIn(says, err["message"])
        return err

    def assert_vector(self, got, want, what):
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        self.assertEqual(got.shape, want.shape, what)
        cos = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
        self.assertGreaterEqual(cos, 0.99999, what)
        rel = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        self.assertLessEqual(rel, 1e-4, what)


class EmbedTest(Base):
    layout = staticmethod(st_layout)

    def embed(self, body):
        return self.ok("/v1/embeddings", {"model": MODEL, **body})

    def test_detected_from_the_checkpoint(self):
        self.assertIn("task: embed", self.server.log_path.read_text())

    def test_reference_cases_through_messages(self):
        for c in REF["embed"]:
            with self.subTest(c["name"]):
                r = self.embed({"messages": messages_of(c)})
                self.assertEqual(len(r["data"]), 1)
                self.assert_vector(r["data"][0]["embedding"], c["embedding"], c["name"])
                self.assertEqual(r["usage"]["prompt_tokens"], c["prompt_tokens"])
                self.assertEqual(r["usage"]["total_tokens"], c["prompt_tokens"])

    def test_text_inputs_in_one_request(self):
        cases = [c for c in REF["embed"] if not c.get("images") and not c.get("videos")
                 and not c.get("instruction")]
        r = self.embed({"input": [c["text"] for c in cases]})
        self.assertEqual(r["object"], "list")
        self.assertEqual([d["index"] for d in r["data"]], list(range(len(cases))))
        for d, c in zip(r["data"], cases):
            self.assertEqual(d["object"], "embedding")
            self.assert_vector(d["embedding"], c["embedding"], c["name"])
        self.assertEqual(r["usage"]["prompt_tokens"], sum(c["prompt_tokens"] for c in cases))
        c = EMBED["text_instruction"]
        r = self.embed({"input": c["text"], "instruction": c["instruction"]})
        self.assert_vector(r["data"][0]["embedding"], c["embedding"], "instruction")

    def test_openai_client(self):
        client = openai.OpenAI(base_url=self.server.url("/v1"), api_key="none")
        texts = [EMBED["text"]["text"], EMBED["empty"]["text"]]
        for fmt in (openai.NOT_GIVEN, "float", "base64"):
            with self.subTest(fmt):
                r = client.embeddings.create(model=MODEL, input=texts, encoding_format=fmt)
                if fmt == "base64":  # the client decodes only when it chose base64 itself
                    vecs = [np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in r.data]
                else:
                    vecs = [d.embedding for d in r.data]
                self.assert_vector(vecs[0], EMBED["text"]["embedding"], "text")
                self.assert_vector(vecs[1], EMBED["empty"]["embedding"], "empty")
                self.assertEqual(r.usage.prompt_tokens,
                                 EMBED["text"]["prompt_tokens"] + EMBED["empty"]["prompt_tokens"])
        r = client.embeddings.create(model=MODEL, input=texts[0], dimensions=8)
        self.assertEqual(len(r.data[0].embedding), 8)
        self.assert_vector(r.data[0].embedding, normalized(EMBED["text"]["hidden"][:8]), "dims")

    def test_dimensions_and_normalize(self):
        c = EMBED["image"]
        msgs = messages_of(c)
        for dims in (1, 5, 16):
            r = self.embed({"messages": msgs, "dimensions": dims})
            self.assert_vector(r["data"][0]["embedding"], normalized(c["hidden"][:dims]), dims)
        r = self.embed({"messages": msgs, "normalize": False})
        self.assert_vector(r["data"][0]["embedding"], c["hidden"], "raw")
        r = self.embed({"messages": msgs, "normalize": False, "dimensions": 4})
        self.assert_vector(r["data"][0]["embedding"], c["hidden"][:4], "raw cut")

    def test_token_ids(self):
        c = EMBED["text"]
        prompt = (f"<|im_start|>system\n{EMBED_DEFAULT}<|im_end|>\n<|im_start|>user\n{c['text']}"
                  "<|im_end|>\n<|im_start|>assistant\n")
        ids = self.ok("/tokenize", {"prompt": prompt})["tokens"]
        self.assertEqual(len(ids), c["prompt_tokens"])
        r = self.embed({"input": ids})
        self.assert_vector(r["data"][0]["embedding"], c["embedding"], "ids")
        r = self.embed({"input": [ids, ids[:-1]]})
        self.assertEqual(len(r["data"]), 2)
        self.assert_vector(r["data"][0]["embedding"], c["embedding"], "ids batch")
        self.assertEqual(r["usage"]["prompt_tokens"], 2 * len(ids) - 1)

    def test_preformatted_text_is_pooled_as_it_is(self):
        c = EMBED["text"]
        prompt = (f"<|im_start|>system\n{EMBED_DEFAULT}<|im_end|>\n<|im_start|>user\n{c['text']}"
                  "<|im_end|>\n<|im_start|>assistant\n")
        r = self.embed({"input": [prompt, c["text"]]})
        self.assert_vector(r["data"][0]["embedding"], c["embedding"], "preformatted")
        self.assert_vector(r["data"][1]["embedding"], c["embedding"], "plain")
        self.assertEqual(r["usage"]["prompt_tokens"], 2 * c["prompt_tokens"])

    def test_concurrent_requests_match(self):
        cases = list(REF["embed"]) * 3
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda c: self.embed({"messages": messages_of(c)}), cases))
        for r, c in zip(got, cases):
            self.assert_vector(r["data"][0]["embedding"], c["embedding"], c["name"])

    def test_score_and_rerank_by_cosine(self):
        q = EMBED["text_instruction"]
        docs = [EMBED["text"], EMBED["empty"]]
        want = [float(normalized(q["embedding"]) @ normalized(d["embedding"])) for d in docs]
        r = self.ok("/v1/score", {"queries": q["text"], "documents": [d["text"] for d in docs],
                                  "instruction": q["instruction"]})
        self.assertEqual([d["object"] for d in r["data"]], ["score", "score"])
        for d, w in zip(r["data"], want):
            self.assertAlmostEqual(d["score"], w, delta=1e-4)
        r = self.ok("/v1/rerank", {"query": q["text"], "documents": [d["text"] for d in docs],
                                   "instruction": q["instruction"]})
        order = sorted(range(2), key=lambda i: -want[i])
        self.assertEqual([x["index"] for x in r["results"]], order)
        for x in r["results"]:
            self.assertAlmostEqual(x["relevance_score"], want[x["index"]], delta=1e-4)

    def test_errors(self):
        e = "/v1/embeddings"
        self.error(e, {"input": "a", "dimensions": 17}, param="dimensions", says="16")
        self.error(e, {"input": "a", "dimensions": 0}, param="dimensions")
        self.error(e, {"input": []}, param="input")
        self.error(e, {"input": [[]]}, param="input[0]")
        self.error(e, {"input": [1, 2, 151936]}, param="input[2]", says="vocabulary")
        self.error(e, {"input": ["a", 3]}, param="input[1]")
        self.error(e, {"input": {"a": 1}}, param="input")
        self.error(e, {"input": "a", "encoding_format": "int8"}, param="encoding_format")
        self.error(e, {"input": "a", "messages": []}, param="messages")
        self.error(e, {}, param="input", says="required")
        self.error(e, {"input": ["a"] * 257}, param="input", says="--max-waiting")
        self.error(e, {"input": [1, 2, 3], "instruction": "x"}, param="instruction")
        self.error(e, {"input": "<|im_start|>a", "instruction": "x"}, param="instruction")
        self.error(e, {"input": "a", "normalize": True, "use_activation": False},
                   param="normalize", says="disagree")
        self.error(e, {"input": "a", "truncate_prompt_tokens": 3}, param="truncate_prompt_tokens",
                   says="not supported")
        self.error(e, {"input": "a", "bogus": 1}, param="bogus")
        self.error(e, {"input": "a", "model": "other"}, status=404, param="model")
        self.error(e, {"messages": [{"role": "user", "content": "a"},
                                    {"role": "assistant", "content": "b"}]},
                   param="messages[1].role")
        self.error(e, {"input": ["a"] * 2049}, param="input", says="2048")
        self.error("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
                   says="--task embed")
        self.error("/v1/completions", {"prompt": "hi"}, says="--task embed")
        # The server is well after the errors.
        self.embed({"input": "still fine"})

    def test_metrics(self):
        before, _ = serve_util.metrics(self.server)
        self.embed({"input": ["a", "b", "c"]})
        self.ok("/v1/score", {"text_1": "a", "text_2": ["b", "c"]})
        after, _ = serve_util.metrics(self.server)
        v = serve_util.value
        self.assertEqual(v(after, "vlm_pooling_requests_total", endpoint="embeddings")
                         - v(before, "vlm_pooling_requests_total", endpoint="embeddings"), 1)
        self.assertEqual(v(after, "vlm_pooling_requests_total", endpoint="score")
                         - v(before, "vlm_pooling_requests_total", endpoint="score"), 1)
        self.assertEqual(v(after, "vlm_pooled_prompts_total")
                         - v(before, "vlm_pooled_prompts_total"), 6)
        self.assertGreater(v(after, "vlm_prompt_tokens_total"),
                           v(before, "vlm_prompt_tokens_total"))


class RerankTest(Base):
    task_args = ("--task", "rerank")

    def document(self, d):
        if d.get("images") or d.get("videos"):
            return {"content": content_parts(d)}
        return d["text"]

    def query(self, q):
        return self.document(q)

    def test_task_logged(self):
        self.assertIn("task: rerank", self.server.log_path.read_text())

    def test_rerank_reference(self):
        for case in REF["rerank"]:
            with self.subTest(case["name"]):
                body = {"model": MODEL, "query": self.query(case["query"]),
                        "documents": [self.document(x["document"]) for x in case["results"]]}
                if case["instruction"]:
                    body["instruction"] = case["instruction"]
                r = self.ok("/v1/rerank", body)
                want = [x["score"] for x in case["results"]]
                self.assertEqual([x["index"] for x in r["results"]],
                                 sorted(range(len(want)), key=lambda i: (-want[i], i)))
                for x in r["results"]:
                    self.assertAlmostEqual(x["relevance_score"], want[x["index"]], delta=1e-4)
                    doc = body["documents"][x["index"]]
                    self.assertEqual(x["document"], {"text": doc} if isinstance(doc, str)
                                     else {"multi_modal": doc["content"]})
                self.assertEqual(r["usage"]["prompt_tokens"],
                                 sum(x["prompt_tokens"] for x in case["results"]))
                self.assertTrue(r["id"].startswith("rerank-"))

    def test_top_n_and_return_documents(self):
        case = REF["rerank"][0]
        docs = [self.document(x["document"]) for x in case["results"]]
        want = [x["score"] for x in case["results"]]
        best = max(range(len(want)), key=lambda i: want[i])
        for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
            r = self.ok(path, {"query": case["query"]["text"], "documents": docs, "top_n": 1,
                               "return_documents": False})
            self.assertEqual(len(r["results"]), 1)
            self.assertEqual(r["results"][0]["index"], best)
            self.assertNotIn("document", r["results"][0])
        r = self.ok("/v1/rerank", {"query": case["query"]["text"], "documents": docs, "top_n": 99})
        self.assertEqual(len(r["results"]), len(docs))

    def test_score_forms(self):
        case = REF["rerank"][0]
        q = case["query"]["text"]
        texts = [x for x in case["results"] if not x["document"].get("images")
                 and not x["document"].get("videos")]
        mm = [x for x in case["results"] if x not in texts]
        docs = [x["document"]["text"] for x in texts]
        for a, b in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
                     ("text_1", "text_2")):
            r = self.ok("/v1/score", {a: q, b: docs})
            self.assertEqual(len(r["data"]), len(docs))
            for d, x in zip(r["data"], texts):
                self.assertAlmostEqual(d["score"], x["score"], delta=1e-4)
        # N:N, 1:1 and a {"content": [...]} whose parts are each a document.
        r = self.ok("/v1/score", {"queries": [q] * len(docs), "documents": docs})
        self.assertEqual(len(r["data"]), len(docs))
        r = self.ok("/v1/score", {"queries": q, "documents": docs[0]})
        self.assertAlmostEqual(r["data"][0]["score"], texts[0]["score"], delta=1e-4)
        parts = [p for x in mm for p in content_parts(x["document"])
                 if len(content_parts(x["document"])) == 1]
        r = self.ok("/v1/score", {"queries": q, "documents": {"content": parts}})
        singles = [x for x in mm if len(content_parts(x["document"])) == 1]
        for d, x in zip(r["data"], singles):
            self.assertAlmostEqual(d["score"], x["score"], delta=1e-4)
        for off in ({"use_activation": False}, {"softmax": False}, {"activation": False}):
            r = self.ok("/v1/score", {"queries": q, "documents": docs[0], **off})
            self.assertAlmostEqual(r["data"][0]["score"], texts[0]["logit"], delta=1e-4)
        # vLLM's defaults of what vlm does not support are accepted.
        self.ok("/v1/score", {"queries": q, "documents": docs[0], "priority": 0,
                              "truncate_prompt_tokens": None})

    def test_preformatted_query_and_documents(self):
        """vLLM's clients of Qwen rerankers write the prompt themselves, split at the document;
        vLLM joins query and document as they are."""
        case = REF["rerank"][1]
        x = case["results"][0]  # a text document
        system = ("Judge whether the Document meets the requirements based on the Query and the "
                  "Instruct provided. Note that the answer can only be \"yes\" or \"no\".")
        query = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n<Instruct>: "
                 f"{case['instruction']}<Query>:{case['query']['text']}\n")
        doc = f"<Document>:{x['document']['text']}<|im_end|>\n<|im_start|>assistant\n"
        r = self.ok("/v1/rerank", {"query": query, "documents": [doc]})
        self.assertAlmostEqual(r["results"][0]["relevance_score"], x["score"], delta=1e-4)
        self.assertEqual(r["usage"]["prompt_tokens"], x["prompt_tokens"])
        r = self.ok("/v1/score", {"text_1": query, "text_2": doc})
        self.assertAlmostEqual(r["data"][0]["score"], x["score"], delta=1e-4)
        self.error("/v1/rerank", {"query": query, "documents": [
            {"content": content_parts({"images": ["red.png"]})}]}, param="documents")

    def test_errors(self):
        self.error("/v1/score", {"queries": ["a", "b", "c"], "documents": ["x", "y"]},
                   param="documents", says="1:N")
        self.error("/v1/score", {"queries": [], "documents": ["x"]}, param="queries")
        self.error("/v1/score", {"queries": "a"}, says="documents")
        self.error("/v1/score", {"queries": "a", "documents": "b", "text_2": "c"}, param="text_2")
        self.error("/v1/rerank", {"documents": ["x"]}, param="query")
        self.error("/v1/rerank", {"query": "a"}, param="documents")
        self.error("/v1/rerank", {"query": "a", "documents": ["x"], "top_n": -1}, param="top_n")
        self.error("/v1/rerank", {"query": ["a"], "documents": ["x"]}, param="query")
        self.error("/v1/rerank", {"query": "a", "documents": [{"content": []}]},
                   param="documents[0].content")
        self.error("/v1/rerank", {"query": "a", "documents": [{"content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
        self.error("/v1/rerank", {"query": "a", "documents": [{"content": [
            {"type": "image_url", "image_url": {"url": "http://example.com/x.png"}}]}]},
            param="documents[0].content[0].image_url")
        # A side given as {"content": [...]}: each part a document, named by its own index.
        self.error("/v1/score", {"queries": "a", "items": {"content": [
            {"type": "text", "text": "x"},
            {"type": "image_url", "image_url": {"url": "http://example.com/x.png"}}]}},
            param="items.content[1].image_url")
        self.error("/v1/score", {"text_1": "a", "text_2": ["b"] * 257}, param="text_2",
                   says="--max-waiting")
        self.error("/v1/rerank", {"query": "a", "documents": ["x"], "priority": 1},
                   param="priority", says="not supported")
        self.error("/v1/embeddings", {"input": "a"}, says="--task rerank")
        self.ok("/v1/rerank", {"query": "a", "documents": ["x"]})


class TaskTest(unittest.TestCase):
    def test_generating_server_refuses_pooling(self):
        tmp = Path(tempfile.mkdtemp(prefix="vlm-pooling-"))
        try:
            model_dir = serve_util.make_model_dir(ARGS.model_dir, tmp / "model")
            server = serve_util.VlmServer(ARGS.vlm, model_dir, tmp, "serve")
            try:
                for path in ("/v1/embeddings", "/v1/score", "/v1/rerank"):
                    r = requests.post(server.url(path), json={"input": "a"}, timeout=TIMEOUT)
                    self.assertEqual(r.status_code, 400, r.text)
                    self.assertIn("--task embed", r.json()["error"]["message"])
            finally:
                server.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_bad_task_and_pooling_mode(self):
        tmp = Path(tempfile.mkdtemp(prefix="vlm-pooling-"))
        try:
            model_dir = serve_util.make_model_dir(ARGS.model_dir, tmp / "model")
            r = subprocess.run([ARGS.vlm, "serve", "-m", str(model_dir), "--task", "classify"],
                               capture_output=True, text=True, timeout=TIMEOUT)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("--task must be auto, generate, embed or rerank", r.stderr)
            st_layout(model_dir, mode="mean_tokens")
            r = subprocess.run([ARGS.vlm, "serve", "-m", str(model_dir), "--port", "0"],
                               capture_output=True, text=True, timeout=TIMEOUT)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("pooling_mode_mean_tokens", r.stderr)
            self.assertIn("last token", r.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    serve_util.run_tests(ARGS, __doc__)
