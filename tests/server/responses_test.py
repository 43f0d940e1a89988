#!/usr/bin/env python3
"""POST /v1/responses (OpenAI's Responses API) through the official client, on the chat path.

- TextTest (the full-vocabulary tiny fixture, greedy): responses.create answers as
  chat.completions.create does for the same conversation — plain text, instructions (a system
  message), an image input, text.format json_schema (its grammar), max_output_tokens (status
  "incomplete") — the same text and the same token counts; the SDK parses every response into
  its own types.
- ToolTest (tests/model/fixtures/forced-reply, whose greedy reply is a reasoning and a
  get_weather call): the reasoning item, the function_call item with its call_id, then the round
  trip: the call and its function_call_output sent back as input items make the same prompt as
  the chat API's assistant tool_calls and tool message.
- Streaming (responses.stream, and the raw events of stream=True): the typed events in order
  (response.created, response.in_progress, each item's added / delta / done events,
  response.completed), sequence numbers 0, 1, 2, ..., and the streamed response equal to the
  one not streamed; for text, an image, a json_schema format and a function call.
- DemoTest: the embedded demo model answers examples/shapes.png through the Responses API
  with the same text as through chat completions, streamed or not.
- StoreTest: a stored response comes back from GET /v1/responses/{id}; previous_response_id
  continues its conversation (the same prompt as the chat API given the whole conversation);
  store false, DELETE and an unknown id are 404s; the store's bound evicts the least recently
  used (a server with --responses-store 2).
- ErrorTest: what is not supported (built-in tools, background mode, file inputs) is a 400
  naming it.
Cases after vLLM's Responses tests where they are not model-specific (input forms, instructions,
function tool round trip, structured output, unsupported tools).

  python3 tests/server/responses_test.py --vlm BUILD/tools/cli/vlm \\
      --model-dir tests/model/fixtures/tiny-fullvocab-bf16 [unittest args]
"""

import argparse
import base64
import json
import shutil
import tempfile
import unittest
from pathlib import Path

import openai

import serve_util
from serve_util import MODEL, REPO

ARGS = argparse.Namespace(vlm=None, model_dir=None)
TIMEOUT = 60
PNG = REPO / "tests/model/fixtures/pooling-server/red.png"


def data_url(path):
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


class Base(unittest.TestCase):
    fixture = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="vlm-responses-"))
        model = serve_util.make_model_dir(cls.fixture or ARGS.model_dir, cls.tmp / "model")
        cls.server = serve_util.VlmServer(ARGS.vlm, model, cls.tmp, "serve", ctx=1024)
        cls.client = openai.OpenAI(base_url=cls.server.url("/v1"), api_key="x", max_retries=0,
                                   timeout=TIMEOUT)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def both(self, messages, chat_extra=None, **kw):
        """The response to `kw` and the chat completion of `messages`, both greedy."""
        r = self.client.responses.create(model=MODEL, temperature=0, **kw)
        c = self.client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                                max_tokens=kw.get("max_output_tokens", 16),
                                                **(chat_extra or {}))
        return r, c

    def streamed(self, **kw):
        """The raw events of stream=True (checked for order and numbering) and the SDK's final
        response through responses.stream."""
        events = list(self.client.responses.create(model=MODEL, stream=True, temperature=0, **kw))
        self.assertEqual([e.sequence_number for e in events], list(range(len(events))))
        self.assertEqual([e.type for e in events[:2]], ["response.created", "response.in_progress"])
        self.assertEqual(events[-1].type, "response.completed")
        open_items, parts = {}, set()
        for e in events[2:-1]:
            if e.type == "response.output_item.added":
                open_items[e.output_index] = e.item.id
            elif e.type == "response.output_item.done":
                self.assertEqual(e.item.id, open_items.pop(e.output_index))
            else:  # within its item, named by its id
                self.assertEqual(e.item_id, open_items[e.output_index], e.type)
                if e.type == "response.content_part.added":
                    parts.add(e.output_index)
                elif e.type in ("response.output_text.delta", "response.reasoning_text.delta"):
                    self.assertIn(e.output_index, parts, "a delta before its content part")
        self.assertEqual(open_items, {})
        with self.client.responses.stream(model=MODEL, temperature=0, **kw) as s:
            for _ in s:
                pass
            final = s.get_final_response()
        return events, final

    def assert_equal_responses(self, a, b):
        """Two responses alike but for their ids (calls' too), times, and the prompt tokens
        the second found in the prefix cache."""
        def norm(r):
            d = r.model_dump(exclude={"id", "created_at"})
            d["usage"]["input_tokens_details"].pop("cached_tokens")
            for o in d["output"]:
                o.pop("id", None)
                o.pop("call_id", None)
                o.pop("parsed_arguments", None)  # the SDK helper's own field
                for p in o.get("content") or []:
                    p.pop("parsed", None)
            return d
        self.assertEqual(norm(a), norm(b))

    def assert_same(self, r, c):
        self.assertEqual(r.object, "response")
        self.assertTrue(r.id.startswith("resp_"))
        self.assertEqual(r.output_text, c.choices[0].message.content or "")
        self.assertEqual(r.usage.input_tokens, c.usage.prompt_tokens)
        self.assertEqual(r.usage.output_tokens, c.usage.completion_tokens)
        self.assertEqual(r.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens)
        want = "incomplete" if c.choices[0].finish_reason == "length" else "completed"
        self.assertEqual(r.status, want)
        if want == "incomplete":
            self.assertEqual(r.incomplete_details.reason, "max_output_tokens")


class TextTest(Base):
    def test_text_input(self):
        r, c = self.both([{"role": "user", "content": "Tell me about the sea."}],
                         input="Tell me about the sea.", max_output_tokens=12)
        self.assert_same(r, c)
        self.assertEqual(r.max_output_tokens, 12)
        self.assertEqual(r.output[0].type, "message")
        self.assertEqual(r.output[0].role, "assistant")

    def test_instructions_and_items(self):
        r, c = self.both(
            [{"role": "system", "content": "Answer in French."},
             {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Bonjour"},
             {"role": "user", "content": [{"type": "text", "text": "More?"}]}],
            instructions="Answer in French.",
            input=[{"role": "user", "content": "Hello"},
                   {"role": "assistant", "content": [{"type": "output_text", "text": "Bonjour"}]},
                   {"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "More?"}]}],
            max_output_tokens=8)
        self.assert_same(r, c)
        self.assertEqual(r.instructions, "Answer in French.")

    def test_image_input(self):
        url = data_url(PNG)
        r, c = self.both(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                          {"type": "text", "text": "What is this?"}]}],
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": url},
                                                {"type": "input_text", "text": "What is this?"}]}],
            max_output_tokens=8)
        self.assert_same(r, c)
        self.assertGreater(r.usage.input_tokens, 20)  # the image's tokens are in the prompt

    def test_json_schema_format(self):
        schema = {"type": "object", "properties": {"a": {"enum": ["x", "yy"]}},
                  "required": ["a"], "additionalProperties": False}
        r, c = self.both(
            [{"role": "user", "content": "Pick."}],
            chat_extra={"response_format": {"type": "json_schema", "json_schema": {
                "name": "pick", "schema": schema, "strict": True}}},
            input="Pick.", max_output_tokens=32,
            text={"format": {"type": "json_schema", "name": "pick", "schema": schema,
                             "strict": True}})
        self.assert_same(r, c)
        self.assertIn(json.loads(r.output_text)["a"], ("x", "yy"))
        self.assertEqual(r.text.format.type, "json_schema")
        _, final = self.streamed(input="Pick.", max_output_tokens=32, text={"format": {
            "type": "json_schema", "name": "pick", "schema": schema, "strict": True}})
        self.assert_equal_responses(final, r)

    def test_streamed_equals_created(self):
        url = data_url(PNG)
        for kw in ({"input": "Tell me about the sea.", "max_output_tokens": 12},
                   {"input": [{"role": "user", "content": [
                       {"type": "input_image", "image_url": url},
                       {"type": "input_text", "text": "What is this?"}]}],
                    "max_output_tokens": 8, "instructions": "Be brief."}):
            r = self.client.responses.create(model=MODEL, temperature=0, **kw)
            events, final = self.streamed(**kw)
            self.assert_equal_responses(final, r)
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            self.assertEqual(text, r.output_text)
            self.assertEqual(events[-1].response.status, r.status)


class ToolTest(Base):
    fixture = REPO / "tests/model/fixtures/forced-reply"
    TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}
    ASK = "What's the weather in Oslo?"

    def test_function_call_round_trip(self):
        r = self.client.responses.create(model=MODEL, input=self.ASK, tools=[self.TOOL],
                                         temperature=0, max_output_tokens=64)
        self.assertEqual(r.status, "completed")
        kinds = [o.type for o in r.output]
        self.assertEqual(kinds, ["reasoning", "function_call"])
        self.assertEqual(r.output[0].content[0].text, "Weather needs a tool.")
        call = r.output[1]
        self.assertEqual(call.name, "get_weather")
        self.assertEqual(json.loads(call.arguments), {"city": "Oslo"})
        self.assertTrue(call.call_id.startswith("call_"))
        self.assertEqual(r.tools[0].name, "get_weather")
        self.assertGreater(r.usage.output_tokens_details.reasoning_tokens, 0)
        # The round trip: the output items and the tool's result as the next input.
        follow = [{"role": "user", "content": self.ASK}, r.output[0].model_dump(),
                  call.model_dump(),
                  {"type": "function_call_output", "call_id": call.call_id, "output": "12 C"}]
        r2 = self.client.responses.create(model=MODEL, input=follow, tools=[self.TOOL],
                                          temperature=0, max_output_tokens=64)
        chat_tool = {"type": "function", "function": {k: v for k, v in self.TOOL.items()
                                                      if k != "type"}}
        c2 = self.client.chat.completions.create(
            model=MODEL, tools=[chat_tool], temperature=0, max_tokens=64,
            messages=[{"role": "user", "content": self.ASK},
                      {"role": "assistant", "content": None,
                       "reasoning_content": "Weather needs a tool.",
                       "tool_calls": [{"id": call.call_id, "type": "function", "function": {
                           "name": "get_weather", "arguments": call.arguments}}]},
                      {"role": "tool", "tool_call_id": call.call_id, "content": "12 C"}])
        self.assertEqual(r2.usage.input_tokens, c2.usage.prompt_tokens)

    def test_streamed_function_call(self):
        kw = dict(input=self.ASK, tools=[self.TOOL], max_output_tokens=64)
        r = self.client.responses.create(model=MODEL, temperature=0, **kw)
        events, final = self.streamed(**kw)
        self.assert_equal_responses(final, r)
        args = "".join(e.delta for e in events
                       if e.type == "response.function_call_arguments.delta")
        self.assertEqual(json.loads(args), {"city": "Oslo"})
        reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        self.assertEqual(reasoning, "Weather needs a tool.")
        added = [e.item for e in events if e.type == "response.output_item.added"]
        self.assertEqual([i.type for i in added], ["reasoning", "function_call"])
        self.assertEqual(added[1].call_id, events[-1].response.output[1].call_id)

    def test_tool_choice_none_keeps_the_text(self):
        r = self.client.responses.create(model=MODEL, input=self.ASK, tools=[self.TOOL],
                                         tool_choice="none", temperature=0, max_output_tokens=64)
        self.assertEqual([o.type for o in r.output], ["reasoning", "message"])
        self.assertIn("<tool_call>", r.output_text)


class DemoTest(Base):
    """The embedded demo model describes examples/shapes.png through the Responses API as
    through chat completions."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="vlm-responses-"))
        cls.server = serve_util.VlmServer(ARGS.vlm, None, cls.tmp, "demo")
        cls.client = openai.OpenAI(base_url=cls.server.url("/v1"), api_key="x", max_retries=0,
                                   timeout=TIMEOUT)

    def test_scene(self):
        url = data_url(REPO / "examples" / "shapes.png")
        r, c = self.both(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                          {"type": "text", "text": "Describe the image."}]}],
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": url},
                                                {"type": "input_text",
                                                 "text": "Describe the image."}]}],
            max_output_tokens=64)
        self.assert_same(r, c)
        self.assertEqual(r.status, "completed")  # the demo model ends its answer
        self.assertGreater(len(r.output_text.split()), 3)
        _, final = self.streamed(input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": url},
            {"type": "input_text", "text": "Describe the image."}]}], max_output_tokens=64)
        self.assertEqual(final.output_text, r.output_text)


class StoreTest(Base):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.small = serve_util.VlmServer(ARGS.vlm, cls.tmp / "model", cls.tmp, "small",
                                         extra_args=["--responses-store", "2"], ctx=1024)
        cls.small_client = openai.OpenAI(base_url=cls.small.url("/v1"), api_key="x",
                                         max_retries=0, timeout=TIMEOUT)

    @classmethod
    def tearDownClass(cls):
        cls.small_client.close()
        cls.small.stop()
        super().tearDownClass()

    def test_get_continue_delete(self):
        r1 = self.client.responses.create(model=MODEL, input="Hello there", temperature=0,
                                          max_output_tokens=6)
        self.assertTrue(r1.store)
        got = self.client.responses.retrieve(r1.id)
        self.assertEqual(got.model_dump(), r1.model_dump())
        r2 = self.client.responses.create(model=MODEL, input="And then?", temperature=0,
                                          max_output_tokens=6, previous_response_id=r1.id)
        self.assertEqual(r2.previous_response_id, r1.id)
        c2 = self.client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=6,
            messages=[{"role": "user", "content": "Hello there"},
                      {"role": "assistant", "content": r1.output_text},
                      {"role": "user", "content": "And then?"}])
        self.assertEqual(r2.usage.input_tokens, c2.usage.prompt_tokens)
        self.assertEqual(r2.output_text, c2.choices[0].message.content)
        # A streamed response is stored too, as its final event shows it.
        events = list(self.client.responses.create(model=MODEL, input="Hi", stream=True,
                                                   max_output_tokens=4, temperature=0))
        final = events[-1].response
        self.assertEqual(self.client.responses.retrieve(final.id).model_dump(),
                         final.model_dump())
        self.client.responses.delete(r1.id)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(r1.id)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.delete(r1.id)
        # OpenAI's answer for a response it does not have: a 400 with the code clients read.
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.responses.create(model=MODEL, input="x", previous_response_id=r1.id)
        self.assertEqual(cm.exception.body["code"], "previous_response_not_found")
        self.assertEqual(cm.exception.body["param"], "previous_response_id")
        # The conversation of r2 does not need r1 any more: it was stored whole.
        r3 = self.client.responses.create(model=MODEL, input="Go on", temperature=0,
                                          max_output_tokens=4, previous_response_id=r2.id,
                                          instructions="Be brief.")
        c3 = self.client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=4,
            messages=[{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Hello there"},
                      {"role": "assistant", "content": r1.output_text},
                      {"role": "user", "content": "And then?"},
                      {"role": "assistant", "content": r2.output_text},
                      {"role": "user", "content": "Go on"}])
        self.assertEqual(r3.usage.input_tokens, c3.usage.prompt_tokens)
        self.assertEqual(r3.output_text, c3.choices[0].message.content)
        unstored = self.client.responses.create(model=MODEL, input="x", store=False,
                                                max_output_tokens=2)
        self.assertFalse(unstored.store)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(unstored.id)

    def test_routes(self):
        import urllib.request
        for method, path, status in (("GET", "/v1/responses/", 404),
                                     ("GET", "/v1/responses/a/b", 404),
                                     ("GET", "/v1/responses/resp_none", 404),
                                     ("POST", "/v1/responses/resp_1", 405)):
            req = urllib.request.Request(self.server.url(path), method=method,
                                         data=b"{}" if method == "POST" else None)
            with self.assertRaises(urllib.error.HTTPError) as cm:
                urllib.request.urlopen(req, timeout=TIMEOUT)
            self.assertEqual(cm.exception.code, status, path)

    def test_least_recently_used_go_first(self):
        c = self.small_client
        ids = [c.responses.create(model=MODEL, input=f"n {i}", max_output_tokens=2).id
               for i in range(2)]
        c.responses.retrieve(ids[0])  # now the most recently used
        third = c.responses.create(model=MODEL, input="n 2", max_output_tokens=2).id
        c.responses.retrieve(ids[0])
        c.responses.retrieve(third)
        with self.assertRaises(openai.NotFoundError):
            c.responses.retrieve(ids[1])


class ErrorTest(Base):
    def error(self, param, **kw):
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.responses.create(model=MODEL, **kw)
        self.assertEqual(cm.exception.body["param"], param, cm.exception.body)
        return cm.exception.body

    def test_unsupported(self):
        self.error("tools[0].type", input="x", tools=[{"type": "web_search"}])
        self.error("background", input="x", background=True)
        self.error("input[0].content[0].type",
                   input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}])
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.create(model="other", input="x")
        # Still well afterwards.
        self.assertEqual(self.client.responses.create(model=MODEL, input="x",
                                                      max_output_tokens=2).status, "incomplete")


if __name__ == "__main__":
    serve_util.run_tests(ARGS, __doc__)
