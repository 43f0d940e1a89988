#!/usr/bin/env python3
"""Structured output (grammar-constrained decoding) of `vlm serve`, end to end.

The server runs as a subprocess on the full-vocabulary tiny fixture: random weights with the real
151,936-token Qwen3 tokenizer. Unconstrained, that model writes gibberish, so every reply that
parses and validates here was made valid by the server's token mask, and sampling at temperature
1 drives the mask through far more of each grammar than a trained model would.

- SchemaTest: 20 JSON Schemas covering the subset the server enforces (types, properties,
  required, additionalProperties, enum, const, arrays with items / prefixItems / minItems /
  maxItems, nested objects, anyOf / oneOf, $defs / $ref including a recursive one, string
  lengths, patterns and formats, integer and number bounds), through response_format
  json_schema, structured_outputs.json and guided_json, plain and streamed, one with an image.
  Every sample must stop on its own within max_tokens, be strict JSON (no NaN, no duplicate keys,
  at most one whitespace character between tokens), validate with jsonschema (formats checked),
  and carry no property the schema does not declare when additionalProperties is absent.
- JsonModeTest: response_format json_object gives one JSON object (a repeated key is legal JSON
  and is accepted there).
- RegexChoiceGrammarTest: structured_outputs regex / choice / grammar (GBNF) and the guided_*
  names: every reply matches the equivalent Python regex, or is one of the choices.
- ToolChoiceTest: tool_choice "required" and a named function: every reply is tool calls to the
  allowed functions whose arguments validate against the tool's parameters;
  parallel_tool_calls false gives exactly one.
- ParseTest: the openai client's chat.completions.parse with Pydantic models, for the reply and
  for a strict function tool's arguments.
- ErrorTest: unsupported schema keywords, malformed regexes and grammars, conflicting constraint
  kinds and impossible tool choices are 400s that name what is wrong.
Each class runs its own server and checks at the end that it is idle (no request running or
waiting, no KV block held) and still alive.

The schemas bound every string (maxLength <= 24, or enum, const, format or pattern) and every
array (maxItems <= 4): a random-weight model does not choose to close an open string or array
soon, so only bounded ones end within max_tokens.

  python3 tests/server/structured_output_test.py --vlm BUILD/tools/cli/vlm \\
      --model-dir tests/model/fixtures/tiny-fullvocab-bf16 [--samples 200] [unittest args]

--samples sets the samples per schema and per case (default 16, quick; 200 for a thorough run);
--seed shifts every sampling seed (the default 0 makes runs repeatable). A failure lists the
seed of each failing sample: a request with that seed and n 1 repeats it. Needs the packages
pinned in scripts/requirements-test.txt (scripts/test.sh makes the venv).
"""

import argparse
import base64
import collections
import concurrent.futures
import copy
import datetime
import enum
import json
import re
import shutil
import sys
import tempfile
import time
import unittest
import uuid
import zlib
from pathlib import Path
from typing import Annotated, Literal, Optional

import jsonschema
import openai
import pydantic
from pydantic import Field

import serve_util
from serve_util import MODEL, REPO

ARGS = argparse.Namespace(vlm=None, model_dir=None, samples=16, seed=0)
SMALL_PNG = REPO / "tests/unit/fixtures/images/png_rgb.png"  # 37x23 RGB
TOKENIZER = REPO / "tests/data/tokenizer/tokenizer.json"

MAX_TOKENS = 512
MAX_N = 8                 # the server's largest n
CTX = 2048                # holds a tool-laden prompt plus MAX_TOKENS
POOL = 8                  # requests in flight at once
REQUEST_TIMEOUT = 300.0   # a request may queue behind POOL - 1 others of MAX_N samples each
SERVER_ARGS = ["--max-num-seqs", "16", "--max-batched-tokens", "256"]

# Token ids in the Qwen3 tokenizer (checked against tests/data/tokenizer/tokenizer.json).
QUOTE, RBRACE, RBRACKET = 1, 92, 60   # '"', '}', ']'
IM_END = 151645                        # <|im_end|>, the end of a reply
# The random model's logits are nearly flat (standard deviation about 0.4) over 151,936 tokens, so
# a bias matters only when it is near ln(151936) = 11.9: at +12 the three closing tokens take
# about a third of the mass wherever they are allowed, and JSON mode's unbounded strings, objects
# and arrays end after a few tokens.
JSON_MODE_BIAS = 12
# A reply of tool calls may end after each call, or open another; +3 on <|im_end|> (allowed only
# where the grammar may end) makes ending the likelier choice, so the calls stay few.
TOOL_END_BIAS = 3


def user(content):
    return [{"role": "user", "content": content}]


def data_url(png):
    return "data:image/png;base64," + base64.b64encode(png).decode()


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def seed_for(label):
    """The first sampling seed of a case: stable across runs, distinct between cases."""
    return ARGS.seed * 1_000_000_000 + (zlib.crc32(label.encode()) % 1_000_000) * 1000


# ----- strict JSON -----

def strict_loads(text, allow_duplicate_keys=False):
    """json.loads, refusing what is not strict JSON: NaN / Infinity, and duplicate keys (unless
    allowed)."""

    def pairs(kv):
        keys = [k for k, _ in kv]
        if not allow_duplicate_keys and len(set(keys)) != len(keys):
            raise ValueError(f"duplicate key in {keys}")
        return dict(kv)

    def constant(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)


def whitespace_problem(text):
    """None when whitespace between JSON tokens is at most one space or newline, else what is
    wrong. Whitespace inside strings does not count."""
    in_string = escaped = False
    run = 0
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch in " \n\t\r":
            if ch in "\t\r":
                return f"{ch!r} between tokens"
            run += 1
            if run > 1:
                return "more than one whitespace character between tokens"
        else:
            run = 0
            in_string = ch == '"'
    return None


# ----- formats, checked strictly (without rfc3339-validator jsonschema skips date-time) -----

FORMATS = jsonschema.FormatChecker()
_TIME = r"([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"


def _iso_time(hh, mm, ss, fraction, offset):
    """An RFC 3339 full-time (the groups of _TIME) as Python's isoformat, or None when out of
    range. RFC 3339 allows a leap second (:60); Python does not, so it is read as :59."""
    if int(hh) > 23 or int(mm) > 59 or int(ss) > 60:
        return None
    if offset in ("Z", "z"):
        offset = "+00:00"
    elif int(offset[1:3]) > 23 or int(offset[4:6]) > 59:
        return None
    return f"{hh}:{mm}:{min(int(ss), 59):02d}{(fraction or '')[:7]}{offset}"


@FORMATS.checks("date")
def is_date(s):
    if not isinstance(s, str):
        return True
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", s):
        return False
    try:
        datetime.date.fromisoformat(s)
        return True
    except ValueError:
        return False


@FORMATS.checks("time")
def is_time(s):
    if not isinstance(s, str):
        return True
    m = re.fullmatch(_TIME, s)
    iso = m and _iso_time(*m.groups())
    if not iso:
        return False
    try:
        datetime.time.fromisoformat(iso)
        return True
    except ValueError:
        return False


@FORMATS.checks("date-time")
def is_date_time(s):
    if not isinstance(s, str):
        return True
    m = re.fullmatch(r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt]" + _TIME, s)
    if not m or not is_date(m[1]):
        return False
    iso = _iso_time(*m.groups()[1:])
    if not iso:
        return False
    try:
        datetime.datetime.fromisoformat(f"{m[1]}T{iso}")
        return True
    except ValueError:
        return False


@FORMATS.checks("uuid")
def is_uuid(s):
    if not isinstance(s, str):
        return True
    if not re.fullmatch(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", s):
        return False
    try:
        uuid.UUID(s)
        return True
    except ValueError:
        return False


@FORMATS.checks("email")
def is_email(s):
    if not isinstance(s, str):
        return True
    local, at, domain = s.partition("@")
    return bool(at) and bool(local) and bool(domain) and "@" not in domain


# ipv4 stays jsonschema's own check: ipaddress.IPv4Address (dotted decimal, no leading zeros).


# ----- schema helpers -----

_SUBSCHEMA_MAPS = ("properties", "$defs")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not")


def subschemas(schema):
    """The schemas directly inside `schema` (not enum or const values)."""
    if not isinstance(schema, dict):
        return
    for key in _SUBSCHEMA_MAPS:
        yield from schema.get(key, {}).values()
    for key in _SUBSCHEMA_LISTS:
        yield from schema.get(key, [])
    for key in _SUBSCHEMA_ONE:
        if isinstance(schema.get(key), dict):
            yield schema[key]


def strict_schema(schema):
    """`schema` with additionalProperties false wherever it declares properties and says nothing
    of others: what the server produces there (OpenAI's strict mode)."""
    schema = copy.deepcopy(schema)
    todo = [schema]
    while todo:
        s = todo.pop()
        if isinstance(s, dict) and "properties" in s and "additionalProperties" not in s:
            s["additionalProperties"] = False
        todo.extend(subschemas(s))
    return schema


def unbounded_parts(schema, where="#"):
    """Where `schema` allows a string or an array that a random model may never close."""
    out = []
    if not isinstance(schema, dict):
        return out
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    closed = any(k in schema for k in ("enum", "const", "format", "pattern"))
    if "string" in types and not closed and schema.get("maxLength", 1e9) > 24:
        out.append(f"{where}: string without maxLength <= 24")
    if "array" in types and schema.get("maxItems", 1e9) > 4 and not (
            "prefixItems" in schema and schema.get("items") is False):
        out.append(f"{where}: array without maxItems <= 4")
    for key in _SUBSCHEMA_MAPS:
        for name, sub in schema.get(key, {}).items():
            out += unbounded_parts(sub, f"{where}/{key}/{name}")
    for key in _SUBSCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key, [])):
            out += unbounded_parts(sub, f"{where}/{key}/{i}")
    for key in _SUBSCHEMA_ONE:
        out += unbounded_parts(schema.get(key), f"{where}/{key}")
    return out


def validators(schema):
    """(what it checks, validator) pairs: the schema as given, then in strict mode."""
    return [("schema", jsonschema.Draft202012Validator(schema, format_checker=FORMATS)),
            ("no undeclared property",
             jsonschema.Draft202012Validator(strict_schema(schema), format_checker=FORMATS))]


def json_problem(text, checks, allow_duplicate_keys=False):
    """None when `text` is strict JSON, spaced as the server promises, and valid under every
    validator of `checks`; else what is wrong."""
    if not isinstance(text, str):
        return f"content is {text!r}"
    try:
        value = strict_loads(text, allow_duplicate_keys)
    except ValueError as e:
        return f"not JSON ({e})"
    if (ws := whitespace_problem(text)):
        return ws
    for what, v in checks:
        errors = sorted(v.iter_errors(value), key=lambda e: e.json_path)
        if errors:
            return f"{what}: {errors[0].message} at {errors[0].json_path}"
    return None


# ----- the schemas -----

S = lambda n: {"type": "string", "maxLength": n}  # noqa: E731  a bounded string
INT = lambda lo, hi: {"type": "integer", "minimum": lo, "maximum": hi}  # noqa: E731
NUM = lambda lo, hi: {"type": "number", "minimum": lo, "maximum": hi}  # noqa: E731


def obj(properties, required=None, **kw):
    """An object schema; every property is required unless `required` says otherwise."""
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required, **kw}


# (name, schema, options): api is how the schema is sent (response_format json_schema,
# structured_outputs.json or guided_json), stream streams the replies, image puts a picture in
# the prompt, n is the samples per request.
SCHEMAS = [
    ("flat_person", obj({
        "name": S(16), "age": INT(0, 130), "height_m": NUM(0.3, 2.5), "member": {"type": "boolean"}}),
     {}),
    ("nested_address", obj({
        "name": S(16),
        "address": obj({
            "street": S(24), "city": S(16),
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            "geo": obj({"lat": NUM(-90, 90), "lon": NUM(-180, 180)}, additionalProperties=False)},
            required=["street", "city"], additionalProperties=False)},
        additionalProperties=False),
     {"stream": True}),
    ("array_of_objects", {
        "type": "array", "minItems": 1, "maxItems": 4,
        "items": obj({"sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
                      "qty": INT(1, 99), "note": S(10)}, required=["sku", "qty"])},
     {}),
    ("enums", obj({
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"type": "string", "enum": ["S", "M", "L", "XL"]},
        "level": {"type": "integer", "enum": [1, 2, 3, 5, 8]},
        "mixed": {"enum": ["auto", 1, 2.5, True, None, {"a": 1}, [1, "two"]]},
        "text": {"enum": ["café", "naïve", "日本語", "party 🎉", 'say "hi"', "back\\slash",
                          "tab\there"]}}),
     {"api": "structured_outputs"}),
    ("const", obj({
        "version": {"const": 2},
        "kind": {"const": "invoice"},
        "pi": {"const": 3.14},
        "flag": {"const": False},
        "nothing": {"const": None},
        "meta": {"const": {"a": [1, "b", None], "c": True}},
        "text": {"const": "line\nbreak é \"q\""},
        "free": S(6)}),
     {"api": "guided_json"}),
    ("optional_anyof", obj({
        "nickname": {"anyOf": [S(12), {"type": "null"}]},
        "score": {"anyOf": [INT(0, 10), {"type": "null"}]},
        "tags": {"anyOf": [{"type": "array", "items": S(6), "maxItems": 2}, {"type": "null"}]},
        "middle_name": S(8),
        "retired": {"type": "boolean"}},
        required=["nickname", "score", "tags"]),
     {}),
    ("oneof_shapes", obj({
        "shape": {"oneOf": [
            obj({"kind": {"const": "circle"}, "radius": NUM(0, 10)}),
            obj({"kind": {"const": "rect"}, "w": INT(1, 50), "h": INT(1, 50)}),
            obj({"kind": {"const": "label"}, "text": S(12)})]},
        "value": {"anyOf": [INT(0, 9), S(3), {"type": "boolean"}]}}),
     {}),
    ("defs_ref", {
        "$defs": {
            "point": obj({"x": INT(-100, 100), "y": INT(-100, 100)}),
            "colour": {"enum": ["red", "green", "blue"]},
            "segment": obj({"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"},
                            "colour": {"$ref": "#/$defs/colour"}}),
        },
        **obj({"origin": {"$ref": "#/$defs/point"},
               "segments": {"type": "array", "items": {"$ref": "#/$defs/segment"},
                            "minItems": 1, "maxItems": 3}})},
     {"api": "structured_outputs"}),
    # Recursive: a node's children are null or at most one node, so a chain ends soon.
    ("recursive_tree", {
        "$defs": {"node": obj({
            "value": INT(-100, 100), "label": S(6),
            "children": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 1},
                                   {"type": "null"}]}},
            required=["value", "children"])},
        "$ref": "#/$defs/node"},
     {"stream": True}),
    ("string_formats", obj({
        "day": {"type": "string", "format": "date"},
        "when": {"type": "string", "format": "date-time"},
        "at": {"type": "string", "format": "time"},
        "id": {"type": "string", "format": "uuid"},
        "mail": {"type": "string", "format": "email"},
        "ip": {"type": "string", "format": "ipv4"}}),
     {}),
    ("integer_ranges", obj({
        "negative": INT(-50, -10),
        "around_zero": {"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5},
        "narrow": INT(1000, 1010),
        "single": INT(7, 7),
        "natural": {"type": "integer", "minimum": 0},
        "below": {"type": "integer", "maximum": -3},
        "any": {"type": "integer"}}),
     {}),
    ("number_ranges", obj({
        "probability": NUM(0, 1),
        "celsius": NUM(-273.15, 100),
        "positive": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
        "open": {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1},
        "any": {"type": "number"}}),
     {"api": "structured_outputs"}),
    ("string_patterns", obj({
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"},
        "slug": {"type": "string", "pattern": "^(foo|bar)_[a-z]{1,5}$"},
        "clock": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"}}),
     {"stream": True}),
    # n 1: each request's usage is one sample's.
    ("string_lengths", obj({
        "one": {"type": "string", "minLength": 1, "maxLength": 1},
        "short": {"type": "string", "minLength": 2, "maxLength": 4},
        "exact": {"type": "string", "minLength": 5, "maxLength": 5},
        "upto": {"type": "string", "maxLength": 24},
        "empty": {"type": "string", "maxLength": 0}}),
     {"n": 1}),
    ("array_bounds", obj({
        "tags": {"type": "array", "items": S(8), "minItems": 1, "maxItems": 3},
        "pair": {"type": "array", "items": INT(0, 9), "minItems": 2, "maxItems": 2},
        "none": {"type": "array", "items": {"type": "integer"}, "maxItems": 0},
        "grid": {"type": "array", "minItems": 1, "maxItems": 2,
                 "items": {"type": "array", "items": INT(0, 9), "maxItems": 2}},
        "picks": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 4}}),
     {}),
    ("booleans_nulls", obj({
        "flag": {"type": "boolean"},
        "nothing": {"type": "null"},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 4},
        "nulls": {"type": "array", "items": {"type": "null"}, "maxItems": 2},
        "tri": {"enum": [True, False, None]}}),
     {"api": "guided_json"}),
    ("type_lists", obj({
        "text_or_null": {"type": ["string", "null"], "maxLength": 10},
        "int_or_bool": {"type": ["integer", "boolean"]},
        "num_or_text": {"type": ["number", "string"], "maxLength": 6, "minimum": 0, "maximum": 5},
        "list_or_null": {"type": ["array", "null"], "items": INT(0, 3), "maxItems": 3}}),
     {"api": "structured_outputs"}),
    ("invoice", obj({
        "invoice_id": {"type": "string", "pattern": "^INV-[0-9]{6}$"},
        "issued": {"type": "string", "format": "date"},
        "due": {"type": "string", "format": "date"},
        "customer": obj({"name": S(24), "email": {"type": "string", "format": "email"},
                         "vip": {"type": "boolean"}}, required=["name", "email"]),
        "currency": {"enum": ["USD", "EUR", "GBP", "JPY"]},
        "lines": {"type": "array", "minItems": 1, "maxItems": 3, "items": obj({
            "description": S(24), "quantity": INT(1, 100), "unit_price": NUM(0, 10000)})},
        "subtotal": {"type": "number", "minimum": 0},
        "tax_rate": NUM(0, 0.5),
        "paid": {"type": "boolean"},
        "notes": {"anyOf": [S(24), {"type": "null"}]}}),
     {"stream": True}),
    ("prefix_items", obj({
        "point": {"type": "array", "minItems": 3, "items": False,
                  "prefixItems": [NUM(-90, 90), NUM(-180, 180), {"enum": ["m", "km"]}]},
        "record": {"type": "array", "minItems": 2, "maxItems": 4, "items": {"type": "boolean"},
                   "prefixItems": [S(8), {"type": "integer"}]}}),
     {}),
    ("image_caption", obj({
        "caption": S(24),
        "objects": {"type": "array", "items": {"enum": ["circle", "square", "triangle", "star"]},
                    "maxItems": 4},
        "count": INT(0, 20),
        "dominant_color": {"enum": ["red", "green", "blue", "other"]},
        "confidence": NUM(0, 1)}),
     {"image": True}),
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": obj({"city": S(16), "unit": {"enum": ["celsius", "fahrenheit"]}}, required=["city"])}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers",
        "parameters": obj({"a": INT(-1000, 1000), "b": INT(-1000, 1000)})}},
    {"type": "function", "function": {
        "name": "search", "description": "Searches the catalogue",
        "parameters": obj({"query": S(24), "limit": INT(1, 10),
                           "filters": obj({"lang": {"enum": ["en", "de", "fr"]},
                                           "since": {"type": "string", "format": "date"}}, required=[])},
                          required=["query"])}},
    {"type": "function", "function": {
        "name": "now", "description": "The current time", "parameters": obj({})}},
]


# ----- Pydantic models for ParseTest -----

class Colour(str, enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Address(pydantic.BaseModel):
    city: str = Field(max_length=16)
    postcode: str = Field(pattern=r"^[0-9]{4,5}$")


class Pet(pydantic.BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=30)
    microchip: int
    weight_kg: float = Field(ge=0, le=100)
    species: Literal["cat", "dog", "parrot"]
    colour: Colour
    home: Address
    nickname: Optional[str] = Field(default=None, max_length=8)
    toys: list[Annotated[str, Field(max_length=8)]] = Field(max_length=3)
    vaccinated: bool


class AddNumbers(pydantic.BaseModel):
    """Adds two integers."""
    a: int = Field(ge=-1000, le=1000)
    b: int = Field(ge=-1000, le=1000)


# ----- the tests -----

Sample = collections.namedtuple("Sample", "seed content finish tool_calls")
Call = collections.namedtuple("Call", "id name arguments")


class Base(unittest.TestCase):
    """A server of its own per class; requests go out POOL at a time; at the end the server must
    be idle and alive. Prints how long each test took."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="vlm_structured_test_"))
        cls.model_dir = serve_util.make_model_dir(ARGS.model_dir, cls.tmp / "model")
        cls.server = serve_util.VlmServer(ARGS.vlm, cls.model_dir, cls.tmp, cls.__name__,
                                          SERVER_ARGS, ctx=CTX)
        cls.client = openai.OpenAI(base_url=cls.server.url("/v1"), api_key="x", max_retries=0,
                                   timeout=REQUEST_TIMEOUT)
        cls.pool = concurrent.futures.ThreadPoolExecutor(POOL)
        cls.timings = {}

    @classmethod
    def tearDownClass(cls):
        cls.pool.shutdown(wait=True, cancel_futures=True)
        cls.client.close()
        problem = None
        try:
            problem = cls.idle_problem()
        except Exception as e:  # noqa: BLE001  /metrics not answering is a problem too
            problem = f"GET /metrics failed: {e!r}"
        alive = cls.server.proc.poll() is None
        output = cls.server.output()
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if cls.timings:
            print(f"\n{cls.__name__}: seconds, samples, completion tokens per test", file=sys.stderr)
            for name, (secs, samples, tokens) in sorted(cls.timings.items()):
                print(f"  {name:40s} {secs:7.2f} s {samples:5d} {tokens:8d}", file=sys.stderr)
        if not alive:
            raise AssertionError(f"vlm serve exited during the tests:\n{output}")
        if problem:
            raise AssertionError(f"{problem}\n{output}")

    @classmethod
    def idle_problem(cls, timeout=30.0):
        """None once no request runs or waits and no KV block is held; else what is left."""
        deadline = time.monotonic() + timeout
        while True:
            m, _ = serve_util.metrics(cls.server)
            state = tuple(serve_util.value(m, k) for k in (
                "vlm_num_requests_running", "vlm_num_requests_waiting", "vlm_kv_cache_blocks_used"))
            if state == (0, 0, 0):
                return None
            if time.monotonic() > deadline:
                return f"server not idle after {timeout} s: running/waiting/kv_used = {state}"
            time.sleep(0.1)

    def setUp(self):
        self.t0 = time.monotonic()
        self.n_samples = 0
        self.n_tokens = 0

    def tearDown(self):
        self.timings[self._testMethodName] = (time.monotonic() - self.t0, self.n_samples, self.n_tokens)

    # ----- sampling -----

    def complete(self, messages, n, seed, stream=False, **kw):
        """The choices of one chat request (sampled at temperature 1; choice i with seed + i) as
        Samples, and the request's completion tokens."""
        args = dict(model=MODEL, messages=messages, n=n, seed=seed, temperature=1.0, top_p=1.0,
                    max_tokens=MAX_TOKENS, **kw)
        if not stream:
            r = self.client.chat.completions.create(**args)
            if sorted(c.index for c in r.choices) != list(range(n)):
                raise AssertionError(f"seed {seed}: choice indices {[c.index for c in r.choices]}, n {n}")
            out = [Sample(seed + c.index, c.message.content, c.finish_reason,
                          [Call(t.id, t.function.name, t.function.arguments)
                           for t in c.message.tool_calls or []])
                   for c in sorted(r.choices, key=lambda c: c.index)]
            usage = r.usage
        else:
            content, calls, finish, usage = {}, {}, {}, None
            for chunk in self.client.chat.completions.create(
                    stream=True, stream_options={"include_usage": True}, **args):
                if chunk.usage is not None:
                    if chunk.choices:
                        raise AssertionError(f"seed {seed}: the usage chunk carries choices")
                    usage = chunk.usage
                    continue
                if usage is not None:
                    raise AssertionError(f"seed {seed}: a chunk after the usage chunk")
                for ch in chunk.choices:
                    i = ch.index
                    if i in finish:
                        raise AssertionError(f"seed {seed}: choice {i} goes on after its finish_reason")
                    content[i] = content.get(i, "") + (ch.delta.content or "")
                    for t in ch.delta.tool_calls or []:
                        c = calls.setdefault(i, {}).setdefault(
                            t.index, {"id": None, "name": None, "arguments": ""})
                        if t.id:
                            if c["id"] is not None:
                                raise AssertionError(f"seed {seed}: choice {i}: tool call id sent twice")
                            c["id"] = t.id
                        if t.function is not None:
                            c["name"] = t.function.name or c["name"]
                            c["arguments"] += t.function.arguments or ""
                    if ch.finish_reason is not None:
                        finish[i] = ch.finish_reason
            if sorted(finish) != list(range(n)) or sorted(content) != list(range(n)):
                raise AssertionError(f"seed {seed}: finish_reason for choices {sorted(finish)}, n {n}")
            if usage is None:
                raise AssertionError(f"seed {seed}: no usage chunk with stream_options.include_usage")
            out = [Sample(seed + i, content[i], finish[i],
                          [Call(**c) for _, c in sorted(calls.get(i, {}).items())]) for i in range(n)]
        if usage.completion_tokens > n * MAX_TOKENS:
            raise AssertionError(f"seed {seed}: {usage.completion_tokens} completion tokens for n {n}")
        return out, usage.completion_tokens

    def sample_many(self, messages, total, seed, n=MAX_N, stream=False, **kw):
        """`total` samples in requests of up to n choices, POOL requests at a time; seeds from
        `seed` up."""
        jobs, done = [], 0
        while done < total:
            k = min(n, total - done)
            jobs.append(self.pool.submit(self.complete, messages, k, seed + done, stream, **kw))
            done += k
        samples = []
        for job in jobs:
            got, tokens = job.result()
            samples += got
            self.n_tokens += tokens
        self.n_samples += len(samples)
        return samples

    def assert_no_problems(self, problems, total, what):
        shown = "\n".join(problems[:8])
        self.assertEqual(len(problems), 0, f"{len(problems)} of {total} samples of {what} fail:\n{shown}")


def _fmt(content, limit=300):
    return repr(content)[:limit]


def constraint(field, kind, value):
    """The extra_body asking for `kind` (regex, choice, grammar) as structured_outputs.<kind>, or
    under vLLM's older name `field` (guided_regex, ...)."""
    return {"structured_outputs": {kind: value}} if field == "structured_outputs" else {field: value}


class SchemaTest(Base):
    """Each schema of SCHEMAS, --samples times (test_NN_<name>)."""

    def test_00_schemas_are_valid_and_bounded(self):
        names = [name for name, _, _ in SCHEMAS]
        self.assertEqual(len(names), 20)
        self.assertEqual(len(set(names)), len(names))
        for name, schema, _ in SCHEMAS:
            jsonschema.Draft202012Validator.check_schema(schema)
            self.assertEqual(unbounded_parts(schema), [], name)

    def test_00_format_checks(self):
        good = {"date": ["2024-02-29", "1999-12-31"],
                "date-time": ["2024-01-31T23:59:60Z", "2024-01-01t00:00:00.123456789+05:30"],
                "time": ["00:00:00Z", "23:59:59.5-08:00"],
                "uuid": ["123e4567-e89b-12d3-a456-426614174000"],
                "email": ["a@b.co"], "ipv4": ["0.0.0.0", "255.255.255.255"]}
        bad = {"date": ["2023-02-29", "2024-13-01", "2024-1-01", "２０２４-01-01"],
               "date-time": ["2024-01-01T24:00:00Z", "2024-01-01 00:00:00Z", "2024-01-01T00:00:00"],
               "time": ["12:00:00", "12:60:00Z", "12:00:00+24:00"],
               "uuid": ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"],
               "email": ["ab.co", "a@b@c", "@b", "a@"], "ipv4": ["01.2.3.4", "256.1.1.1", "1.2.3"]}
        for fmt, values in good.items():
            for v in values:
                self.assertTrue(FORMATS.conforms(v, fmt), f"{fmt} {v!r}")
        for fmt, values in bad.items():
            for v in values:
                self.assertFalse(FORMATS.conforms(v, fmt), f"{fmt} {v!r}")

    def run_schema(self, name, schema, api="response_format", stream=False, image=False, n=MAX_N):
        text = f"Fill in the {name.replace('_', ' ')} record as JSON."
        content = text
        if image:
            content = [image_part(data_url(SMALL_PNG.read_bytes())), {"type": "text", "text": text}]
        if api == "response_format":
            kw = {"response_format": {"type": "json_schema",
                                      "json_schema": {"name": name, "schema": schema, "strict": True}}}
        elif api == "structured_outputs":
            kw = {"extra_body": {"structured_outputs": {"json": schema}}}
        else:
            kw = {"extra_body": {"guided_json": schema}}
        samples = self.sample_many(user(content), ARGS.samples, seed_for(name), n=n, stream=stream, **kw)
        checks = validators(schema)
        problems = []
        for s in samples:
            p = f"finish_reason {s.finish}" if s.finish != "stop" else json_problem(s.content, checks)
            if p:
                problems.append(f"seed {s.seed}: {p}: {_fmt(s.content)}")
        self.assert_no_problems(problems, len(samples), f"{name} ({api}{', streamed' if stream else ''})")


def _schema_test(name, schema, options):
    def test(self):
        self.run_schema(name, schema, **options)
    test.__doc__ = f"schema {name}"
    return test


for _i, (_name, _schema, _options) in enumerate(SCHEMAS, 1):
    setattr(SchemaTest, f"test_{_i:02d}_{_name}", _schema_test(_name, _schema, _options))


class JsonModeTest(Base):
    """response_format json_object: one JSON object, with a logit_bias on the closing tokens so
    that a random model ends its strings, arrays and objects early."""

    def test_json_object(self):
        tokenizer = json.loads(TOKENIZER.read_text())
        vocab = tokenizer["model"]["vocab"]
        self.assertEqual((vocab['"'], vocab["}"], vocab["]"]), (QUOTE, RBRACE, RBRACKET))
        self.assertIn({"id": IM_END, "content": "<|im_end|>"},
                      [{"id": t["id"], "content": t["content"]} for t in tokenizer["added_tokens"]])
        bias = {str(t): JSON_MODE_BIAS for t in (QUOTE, RBRACE, RBRACKET)}
        problems, total = [], 0
        for stream in (False, True):
            count = ARGS.samples if not stream else max(1, ARGS.samples // 2)
            samples = self.sample_many(user("Reply with a JSON object about anything."), count,
                                       seed_for(f"json_object{stream}"), stream=stream,
                                       response_format={"type": "json_object"}, logit_bias=bias)
            total += len(samples)
            for s in samples:
                if s.finish != "stop":
                    p = f"finish_reason {s.finish}"
                else:
                    # JSON mode is any object: RFC 8259 leaves repeated names legal (they
                    # SHOULD be unique) and a grammar cannot keep the keys of an open object
                    # apart, so a repeated key is accepted here (a schema's declared
                    # properties never repeat).
                    p = json_problem(s.content, [], allow_duplicate_keys=True)
                    if p is None and not isinstance(json.loads(s.content), dict):
                        p = "not an object"
                if p:
                    problems.append(f"seed {s.seed}{' (streamed)' if stream else ''}: {p}: {_fmt(s.content)}")
        self.assert_no_problems(problems, total, "json_object")


class RegexChoiceGrammarTest(Base):
    """structured_outputs regex, choice and grammar (GBNF), and vLLM's guided_* names."""

    def check_matches(self, label, samples, pattern):
        problems = []
        for s in samples:
            if s.finish != "stop":
                problems.append(f"seed {s.seed}: finish_reason {s.finish}: {_fmt(s.content)}")
            elif not isinstance(s.content, str) or not re.fullmatch(pattern, s.content):
                problems.append(f"seed {s.seed}: no match: {_fmt(s.content)}")
        self.assert_no_problems(problems, len(samples), label)

    def test_regex(self):
        cases = [  # (regex, field, streamed)
            (r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)", "structured_outputs", False),
            (r"(\+|-)?[0-9]{1,3}(\.[0-9]{1,2})?", "structured_outputs", True),
            (r"(ja|nein|oui|sí|はい) [0-9]{2}", "guided_regex", False),
            (r"[A-Z][a-z]{2,5} [0-9]{4}-(0[1-9]|1[0-2])", "guided_regex", True),
        ]
        for regex, field, stream in cases:
            with self.subTest(regex=regex, field=field):
                samples = self.sample_many(user("Say something."), ARGS.samples, seed_for(regex),
                                           stream=stream, extra_body=constraint(field, "regex", regex))
                self.check_matches(f"{field} {regex}", samples, regex)

    def test_choice(self):
        cases = [  # (choices, field, streamed)
            (["yes", "no", "maybe"], "structured_outputs", False),
            (["red wine", "white wine", "rosé", "water ≈ 0 €"], "guided_choice", True),
            (["go", "gone", "going"], "structured_outputs", False),  # one a prefix of the others
        ]
        count = max(32, ARGS.samples)
        for choices, field, stream in cases:
            with self.subTest(choices=choices, field=field):
                samples = self.sample_many(user("Choose one."), count, seed_for(str(choices)),
                                           stream=stream, extra_body=constraint(field, "choice", choices))
                problems = [f"seed {s.seed}: finish_reason {s.finish}, content {s.content!r}"
                            for s in samples if s.finish != "stop" or s.content not in choices]
                self.assert_no_problems(problems, len(samples), f"{field} {choices}")
                seen = collections.Counter(s.content for s in samples)
                self.assertGreaterEqual(len(seen), 2, f"one choice only in {count} samples: {seen}")

    def test_grammar(self):
        cases = [  # (GBNF, the same language as a Python regex, field, streamed)
            ('root ::= "(" num ("+" num){0,3} ")"\nnum ::= [0-9]{1,4}\n',
             r"\([0-9]{1,4}(\+[0-9]{1,4}){0,3}\)", "structured_outputs", False),
            ('root ::= greeting " " name "!"\n'
             'greeting ::= "hello" | "hi" | "hey"\n'
             'name ::= [a-z] [a-z]? [a-z]? [a-z]?\n',
             r"(hello|hi|hey) [a-z]{1,4}!", "guided_grammar", True),
            ('root ::= "[" item ("," item)? ("," item)? "]"\n'
             'item ::= "\\"" [a-c]{1,3} "\\""\n',
             r'\["[a-c]{1,3}"(,"[a-c]{1,3}")?(,"[a-c]{1,3}")?\]', "structured_outputs", False),
            ('# a key=value line, the value any characters but newline, quote and "="\n'
             'root ::= key "=" value "\\n"?\n'
             'key ::= [a-z]{1,6}\n'
             'value ::= [^\\n"=]{1,8}\n',
             r'[a-z]{1,6}=[^\n"=]{1,8}\n?', "guided_grammar", False),
        ]
        for gbnf, regex, field, stream in cases:
            with self.subTest(grammar=gbnf.splitlines()[0], field=field):
                samples = self.sample_many(user("Write something."), ARGS.samples, seed_for(gbnf),
                                           stream=stream, extra_body=constraint(field, "grammar", gbnf))
                self.check_matches(f"{field} {gbnf!r}", samples, regex)


class ToolChoiceTest(Base):
    """tool_choice "required" and a named function: only calls, to the allowed functions, whose
    arguments validate against the function's parameters."""

    ASK = user("What's the weather in Oslo, and what is 2 + 3? Search the catalogue too.")
    PARAMS = {t["function"]["name"]: validators(t["function"]["parameters"]) for t in TOOLS}

    def run_calls(self, label, tool_choice, allowed, stream=False, parallel=None):
        kw = {"tools": TOOLS, "tool_choice": tool_choice, "logit_bias": {str(IM_END): TOOL_END_BIAS}}
        if parallel is not None:
            kw["parallel_tool_calls"] = parallel
        samples = self.sample_many(self.ASK, ARGS.samples, seed_for(label), stream=stream, **kw)
        problems, counts = [], collections.Counter()
        for s in samples:
            counts[len(s.tool_calls)] += 1
            p = self.call_problem(s, allowed, one=parallel is False)
            if p:
                problems.append(f"seed {s.seed}: {p}: content {_fmt(s.content, 100)}, "
                                f"calls {_fmt(s.tool_calls, 400)}")
        print(f"\n{label}: replies by number of calls {dict(sorted(counts.items()))}", file=sys.stderr)
        self.assert_no_problems(problems, len(samples), label)

    def call_problem(self, s, allowed, one):
        if s.finish != "tool_calls":
            return f"finish_reason {s.finish}"
        if (s.content or "").strip():
            return "content beside the calls"
        if not s.tool_calls:
            return "no tool call"
        if one and len(s.tool_calls) != 1:
            return f"{len(s.tool_calls)} calls with parallel_tool_calls false"
        ids = [c.id for c in s.tool_calls]
        if len(set(ids)) != len(ids) or not all(isinstance(i, str) and i.startswith("call_") for i in ids):
            return f"call ids {ids}"
        for c in s.tool_calls:
            if c.name not in allowed:
                return f"call to {c.name!r}, allowed {allowed}"
            p = json_problem(c.arguments, self.PARAMS[c.name])
            if p:
                return f"{c.name} arguments {c.arguments!r}: {p}"
        return None

    def test_required(self):
        self.run_calls("required", "required", list(self.PARAMS))

    def test_required_single_streamed(self):
        self.run_calls("required, parallel_tool_calls false, streamed", "required", list(self.PARAMS),
                       stream=True, parallel=False)

    def test_named(self):
        self.run_calls("named search", {"type": "function", "function": {"name": "search"}}, ["search"])

    def test_named_single_streamed(self):
        self.run_calls("named add, parallel_tool_calls false, streamed",
                       {"type": "function", "function": {"name": "add"}}, ["add"], stream=True,
                       parallel=False)


class ParseTest(Base):
    """The openai client's chat.completions.parse: it sends the Pydantic model as a strict
    json_schema and validates the reply into the model."""

    def parse_many(self, label, n=MAX_N, **kw):
        def one(seed, k):
            try:
                r = self.client.chat.completions.parse(
                    model=MODEL, n=k, seed=seed, temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS, **kw)
            except (pydantic.ValidationError, openai.LengthFinishReasonError) as e:
                raise AssertionError(f"seeds {seed}..{seed + k - 1}: {e}") from e
            return r.choices, r.usage.completion_tokens

        jobs, done, seed = [], 0, seed_for(label)
        while done < ARGS.samples:
            k = min(n, ARGS.samples - done)
            jobs.append((seed + done, self.pool.submit(one, seed + done, k)))
            done += k
        choices = []
        for seed, job in jobs:
            got, tokens = job.result()
            self.assertEqual(sorted(c.index for c in got), list(range(len(got))))
            choices += [(seed + c.index, c) for c in got]
            self.n_tokens += tokens
        self.n_samples += len(choices)
        return choices

    def test_parse_model(self):
        msgs = user("Describe a pet as JSON.")
        for seed, c in self.parse_many("parse Pet", messages=msgs, response_format=Pet):
            self.assertEqual(c.finish_reason, "stop", f"seed {seed}")
            self.assertIsNone(c.message.refusal, f"seed {seed}")
            self.assertIsInstance(c.message.parsed, Pet, f"seed {seed}: {c.message.content!r}")
            self.assertIsInstance(c.message.parsed.home, Address)
            self.assertIsInstance(c.message.parsed.colour, Colour)
            self.assertIsNone(whitespace_problem(c.message.content), f"seed {seed}: {c.message.content!r}")
            self.assertEqual(c.message.parsed, Pet.model_validate_json(c.message.content))

    def test_parse_tool_arguments(self):
        msgs = user("What is 2 + 3?")
        for seed, c in self.parse_many("parse AddNumbers", messages=msgs,
                                       tools=[openai.pydantic_function_tool(AddNumbers)],
                                       tool_choice="required", parallel_tool_calls=False,
                                       logit_bias={str(IM_END): TOOL_END_BIAS}):
            self.assertEqual(c.finish_reason, "tool_calls", f"seed {seed}")
            calls = c.message.tool_calls or []
            self.assertEqual(len(calls), 1, f"seed {seed}")
            self.assertEqual(calls[0].function.name, "AddNumbers")
            self.assertIsInstance(calls[0].function.parsed_arguments, AddNumbers,
                                  f"seed {seed}: {calls[0].function.arguments!r}")


class ErrorTest(Base):
    """What cannot be enforced is refused with a 400 that names it, before any work; the server
    serves on afterwards."""

    def expect_400(self, needles, stream=False, **kw):
        """A BadRequestError (400) whose message holds one of `needles`."""
        args = dict(model=MODEL, messages=user("hi"), max_tokens=8)
        args.update(kw)
        with self.assertRaises(openai.BadRequestError) as cm:
            r = self.client.chat.completions.create(stream=stream, **args)
            if stream:
                for _ in r:
                    pass
        self.assertEqual(cm.exception.status_code, 400)
        body = cm.exception.body
        message = body.get("message", "") if isinstance(body, dict) else str(body)
        self.assertTrue(any(n in message for n in needles), f"{message!r} names none of {needles}")

    @staticmethod
    def rf(schema):
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}

    def test_unsupported_schema_keywords(self):
        pattern_props = obj({"tags": {"type": "object", "patternProperties": {"^x": {"type": "integer"}}}})
        unique = {"type": "array", "items": {"enum": [1, 2]}, "maxItems": 2, "uniqueItems": True}
        unknown_format = obj({"host": {"type": "string", "format": "hostname-x"}})
        remote_ref = obj({"a": {"$ref": "https://example.com/schema.json"}})
        cases = [
            ("patternProperties", {"response_format": self.rf(pattern_props)}, ("patternProperties",)),
            ("patternProperties via structured_outputs",
             {"extra_body": {"structured_outputs": {"json": pattern_props}}}, ("patternProperties",)),
            ("patternProperties via guided_json", {"extra_body": {"guided_json": pattern_props}},
             ("patternProperties",)),
            ("uniqueItems", {"response_format": self.rf(unique)}, ("uniqueItems",)),
            ("unknown format", {"response_format": self.rf(unknown_format)}, ("hostname-x", "format")),
            ("remote $ref", {"response_format": self.rf(remote_ref)}, ("$ref",)),
            ("patternProperties, streamed", {"response_format": self.rf(pattern_props), "stream": True},
             ("patternProperties",)),
            ("patternProperties in a required tool's parameters",
             {"tools": [{"type": "function", "function": {"name": "f", "parameters": pattern_props}}],
              "tool_choice": "required"}, ("patternProperties",)),
        ]
        for label, kw, needles in cases:
            with self.subTest(label):
                self.expect_400(needles, **kw)

    def test_malformed_regex_and_grammar(self):
        cases = [
            ("unclosed class", {"structured_outputs": {"regex": "[a-z"}}, ("regex", "structured_outputs")),
            ("unclosed group", {"guided_regex": "(ab|cd"}, ("regex",)),
            ("dangling repeat", {"structured_outputs": {"regex": "a{2,1}"}}, ("regex", "structured_outputs")),
            ("unterminated literal", {"structured_outputs": {"grammar": 'root ::= "abc'}},
             ("grammar", "structured_outputs")),
            ("undefined rule", {"guided_grammar": "root ::= item\n"}, ("grammar", "item")),
            ("no root", {"structured_outputs": {"grammar": 'item ::= "a"\n'}},
             ("grammar", "root", "structured_outputs")),
        ]
        for label, body, needles in cases:
            with self.subTest(label):
                self.expect_400(needles, extra_body=body)

    def test_conflicting_constraints(self):
        cases = [
            ("two kinds in structured_outputs",
             {"extra_body": {"structured_outputs": {"regex": "[a-z]{1,3}", "choice": ["a", "b"]}}},
             ("regex", "choice", "structured_outputs")),
            ("two guided_* fields", {"extra_body": {"guided_regex": "[a-z]{1,3}", "guided_choice": ["a"]}},
             ("guided_regex", "guided_choice")),
            ("structured_outputs and guided_choice",
             {"extra_body": {"structured_outputs": {"regex": "[a-z]{1,3}"}, "guided_choice": ["a"]}},
             ("structured_outputs", "guided_choice")),
            ("json_object and structured_outputs",
             {"response_format": {"type": "json_object"},
              "extra_body": {"structured_outputs": {"regex": "[a-z]{1,3}"}}},
             ("response_format", "structured_outputs")),
            ("json_schema and guided_json",
             {"response_format": self.rf({"type": "integer"}),
              "extra_body": {"guided_json": {"type": "integer"}}},
             ("response_format", "guided_json")),
        ]
        for label, kw, needles in cases:
            with self.subTest(label):
                self.expect_400(needles, **kw)

    def test_impossible_tool_choice(self):
        cases = [
            ("named function not in tools",
             {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
             ("nope",)),
            ("required without tools", {"tool_choice": "required"}, ("tool_choice", "tools")),
            ("named without tools", {"tool_choice": {"type": "function", "function": {"name": "add"}}},
             ("tool_choice", "tools")),
        ]
        for label, kw, needles in cases:
            with self.subTest(label):
                self.expect_400(needles, **kw)

    def test_zz_still_serves(self):
        schema = obj({"ok": {"type": "boolean"}})
        samples = self.sample_many(user("Still there?"), 8, seed_for("still serves"),
                                   response_format=self.rf(schema))
        problems = [f"seed {s.seed}: {s.finish}: {_fmt(s.content)}" for s in samples
                    if s.finish != "stop" or json_problem(s.content, validators(schema))]
        self.assert_no_problems(problems, len(samples), "a schema after the errors")


def positive_int(text):
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def main():
    def add_arguments(ap):
        ap.add_argument("--samples", type=positive_int, default=16,
                        help="samples per schema and per case (default 16; 200 for a thorough run)")
        ap.add_argument("--seed", type=int, default=0, help="shifts every sampling seed (default 0)")

    serve_util.run_tests(ARGS, __doc__, add_arguments)

if __name__ == "__main__":
    main()
