#!/usr/bin/env python3
"""Expected renderings of Hugging Face chat templates, for vlm's Jinja interpreter.

Renders every template in tests/model/fixtures/chat_templates/*.jinja (and the Qwen3-VL
Instruct one in tests/model/fixtures/chat_template/) over a shared set of conversations with
transformers' own renderer (transformers.utils.chat_template_utils.render_jinja_template, what
apply_chat_template calls), and a list of feature snippets with the same Jinja environment.
Writes tests/model/fixtures/chat_templates/cases.json. strftime_now sees a fixed date
(2026-01-02 03:04:05 UTC), and bos_token / eos_token are "<s>" / "</s>".

A conversation a template refuses (raise_exception, or an error in the template) is recorded
with "error": true; vlm must refuse it too.

Needs transformers and jinja2 pinned as in scripts/requirements-reference.txt (no torch):
    python3 -m venv VENV && VENV/bin/pip install transformers==4.57.1 jinja2==3.1.6
    VENV/bin/python scripts/make_chat_template_cases.py
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path

import jinja2
import transformers
from transformers.utils import chat_template_utils

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "model" / "fixtures" / "chat_templates"
QWEN3_VL = REPO / "tests" / "model" / "fixtures" / "chat_template" / "chat_template.jinja"
FIXED_NOW = _dt.datetime(2026, 1, 2, 3, 4, 5)


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):  # noqa: D401 - the template's clock
        return FIXED_NOW


chat_template_utils.datetime = _FixedDatetime  # strftime_now reads datetime.now()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello! How are you?"}],
    "system_user": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "An apple."},
        {"role": "user", "content": "And a vegetable?"},
    ],
    "text_parts": [
        {"role": "user", "content": [{"type": "text", "text": "Part one."},
                                     {"type": "text", "text": " Part two."}]},
    ],
    "image": [
        {"role": "user", "content": [{"type": "image"},
                                     {"type": "text", "text": "What is in this picture?"}]},
    ],
    "two_images_multi_turn": [
        {"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                     {"type": "text", "text": "Compare them."}]},
        {"role": "assistant", "content": "The first is brighter."},
        {"role": "user", "content": [{"type": "text", "text": "Why?"}]},
    ],
    "video": [
        {"role": "user", "content": [{"type": "video"},
                                     {"type": "text", "text": "What happens?"}]},
    ],
    "tool_call": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "id": "call_1",
                         "function": {"name": "get_weather",
                                      "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
        {"role": "user", "content": "Thanks — and in Oslo?"},
    ],
    "reasoning": [
        {"role": "user", "content": "Is 17 prime?"},
        {"role": "assistant", "reasoning_content": "17 has no divisors but 1 and itself.",
         "content": "Yes, 17 is prime."},
        {"role": "user", "content": "And 21?"},
    ],
    "unicode": [
        {"role": "user", "content": "Übersetze: «naïve café» → 日本語? 🙂"},
    ],
    # Arguments whose floats json.dumps writes in repr's layout (100000.0, 1e-05, 1e+16), an
    # integer, and a string with a non-ASCII character, a newline and quotes. The call id has the
    # nine letters and digits Mistral's templates insist on.
    "tool_call_floats": [
        {"role": "user", "content": "Plot the point."},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "id": "call00002",
                         "function": {"name": "plot",
                                      "arguments": {"x": 100000.0, "y": 1e-05, "z": 1e16, "n": 3,
                                                    "s": "é\n\"q\""}}}]},
        {"role": "tool", "tool_call_id": "call00002", "name": "plot", "content": "plotted"},
    ],
}

# (name, conversation, tools?, add_generation_prompt, extra template variables)
RUNS = [
    ("user", "user", False, True, {}),
    ("user_no_generation_prompt", "user", False, False, {}),
    ("system_user", "system_user", False, True, {}),
    ("multi_turn", "multi_turn", False, True, {}),
    ("multi_turn_no_generation_prompt", "multi_turn", False, False, {}),
    ("text_parts", "text_parts", False, True, {}),
    ("image", "image", False, True, {}),
    ("two_images_multi_turn", "two_images_multi_turn", False, True, {}),
    ("video", "video", False, True, {}),
    ("tools", "user", True, True, {}),
    ("tool_call", "tool_call", True, True, {}),
    ("reasoning", "reasoning", False, True, {}),
    ("thinking_off", "user", False, True, {"enable_thinking": False}),
    ("thinking_on", "user", False, True, {"enable_thinking": True}),
    ("unicode", "unicode", False, True, {}),
    ("tool_call_floats", "tool_call_floats", True, True, {}),
]

# Feature snippets, rendered by the environment transformers builds (trim/lstrip blocks, its
# tojson, raise_exception, strftime_now, loop controls).
SNIPPETS = [
    ("{% for x in items %}{{ loop.index }}/{{ loop.length }}:{{ x }}{% if not loop.last %}, {% endif %}{% endfor %}",
     {"items": ["a", "b", "c"]}),
    ("{% for x in items if x > 1 %}{{ x }}{{ loop.first }}{{ loop.revindex0 }} {% else %}none{% endfor %}",
     {"items": [1, 2, 3]}),
    ("{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": [1, 2]}}),
    ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     {"xs": [1, 2, 3, 4, 5]}),
    ("{% set ns = namespace(found=false, n=0) %}{% for x in xs %}{% if x > 2 %}{% set ns.found = true %}{% set ns.n = ns.n + x %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.n }}",
     {"xs": [1, 2, 3, 4]}),
    ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", {}),
    ("{{ s[::-1] }}|{{ s[1:3] }}|{{ s[-2:] }}|{{ xs[::2] }}|{{ xs[-1] }}|{{ xs[1:] }}",
     {"s": "abcdef", "xs": [1, 2, 3, 4, 5]}),
    ("{{ 'Hello'.startswith('He') }} {{ 'a,b,,c'.split(',') }} {{ '  x  '.strip() }}|{{ 'xxhixx'.lstrip('x') }}|{{ 'a-b'.replace('-', '+') }} {{ 'Ab'.upper() }}{{ 'Ab'.lower() }} {{ ' a  b '.split() }}",
     {}),
    ("{{ d | tojson }} {{ d | tojson(indent=2) }} {{ [1, 2.5, none, true, 'é\"\\n'] | tojson }}",
     {"d": {"name": "x", "n": 1, "f": 0.1, "nested": {"l": [1, {"a": None}]}, "big": 1e20}}),
    ("{{ xs | length }} {{ xs | first }} {{ xs | last }} {{ xs | join('-') }} {{ xs | map('string') | join }} {{ ws | map(attribute='n') | list }}",
     {"xs": [3, 1, 2], "ws": [{"n": "a"}, {"n": "b"}]}),
    ("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | join(',') }} {{ ms | rejectattr('role', 'equalto', 'user') | list | length }}",
     {"ms": [{"role": "user", "c": "1"}, {"role": "system", "c": "2"}, {"role": "user", "c": "3"}]}),
    ("{{ x | default('d') }} {{ none_v | default('d') }} {{ '' | default('e', true) }} {{ y is defined }} {{ x is defined }} {{ none_v is none }} {{ 's' is string }} {{ d is mapping }} {{ xs is iterable }} {{ 1 is number }} {{ 2 is not none }}",
     {"none_v": None, "y": 1, "d": {}, "xs": []}),
    ("{{ 'a' in 'cat' }} {{ 1 in [1, 2] }} {{ 'k' in d }} {{ 'z' not in d }} {{ 1 < 2 < 3 }} {{ 'b' > 'a' }} {{ 3 // 2 }} {{ 7 % 3 }} {{ -7 // 2 }} {{ 2 ** 10 }} {{ 1 / 4 }} {{ 'ab' ~ 1 ~ none }} {{ 'x' * 3 }}",
     {"d": {"k": 1}}),
    ("{{ 'yes' if a else 'no' }} {{ a and b }} {{ a or b }} {{ not a }} {{ (1, 2) }} {{ [1, 'a', none, 1.0] }} {{ {'a': 1} }} {{ 1.0 }} {{ 1e-5 }} {{ 100000.0 }} {{ 1.5e16 }}",
     {"a": 0, "b": "B"}),
    ("{% macro greet(name, greeting='Hi') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', greeting='Yo') }} {{ greet(name='Cy') }}",
     {}),
    ("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ v }}{% endcall %}",
     {"v": 1}),
    ("{% set block %}\n  inner {{ 1 + 1 }}\n{% endset %}[{{ block }}]", {}),
    ("{%- if true %}\n    a\n{%- endif %}\n  {{- ' b ' -}}  \n{# comment #}\n   {% if true %}\nc\n   {% endif %}\nd", {}),
    ("{{ strftime_now('%Y-%m-%d %H:%M') }} {{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.get('z') }} {{ d.keys() | list }} {{ d['a'] }} {{ d.a }}",
     {"d": {"a": 1}}),
    ("{% for m in messages %}{{ m['role'] | capitalize }}:{{ m.content | trim }}|{% endfor %}{{ messages | length }} {{ messages[0].content.split(' ')[0] }}",
     {"messages": [{"role": "user", "content": "  hi there  "}, {"role": "assistant", "content": "yo"}]}),
    ("{{ raise_exception('no system messages') }}", {}),
    ("{{ (xs | sort) }} {{ xs | sort(reverse=true) }} {{ xs | unique | list }} {{ d | dictsort }} {{ 'abc' | list }} {{ 'a b c' | wordcount }} {{ -3 | abs }} {{ '42' | int + 1 }} {{ 2.567 | round(1) }}",
     {"xs": [3, 1, 3, 2], "d": {"b": 2, "a": 1}}),
    ("{{ 'line1\\nline2' | indent(2) }}|{{ 'line1\\nline2' | indent(2, true) }}|{{ ' x ' ~ xs | length }}", {"xs": [1]}),
    ("{% if x is string and x | length > 2 %}long{% elif x is string %}short{% else %}other{% endif %}", {"x": "abcd"}),
    ("{% for i in range(3) %}{{ i }}{% endfor %} {% for i in range(1, 7, 2) %}{{ i }}{% endfor %} {{ loop is defined }}", {}),
    # tojson's floats, escapes and arguments (transformers' tojson(x, ensure_ascii=False,
    # indent=None, separators=None, sort_keys=False)), and the floats as {{ }} prints them.
    ("{{ args | tojson }}|{{ args | tojson(indent=2) }}|{{ args | tojson(ensure_ascii=true, sort_keys=true) }}|{{ args | tojson(separators=(',', ':')) }}|{{ args | tojson(false, 1, none, true) }}|{{ args.x }} {{ args.y }} {{ args.z }} {{ args.w }}",
     {"args": {"x": 100000.0, "y": 1e-05, "z": 1e16, "n": 3, "s": "é\n\"q\"\x7f\x01",
               "w": [1.5e-05, 0.0001, -0.0, 1e15, 123456789012345678.0, 0.1, [], {}]}}),
]


def render(template: str, run: tuple) -> dict:
    name, conv, tools, agp, extra = run
    kwargs = {"bos_token": "<s>", "eos_token": "</s>", **extra}
    try:
        out, _ = chat_template_utils.render_jinja_template(
            conversations=[CONVERSATIONS[conv]], tools=TOOLS if tools else None,
            chat_template=template, add_generation_prompt=agp, **kwargs)
        return {"name": name, "conversation": conv, "tools": tools, "add_generation_prompt": agp,
                "kwargs": extra, "rendered": out[0]}
    except (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError, IndexError,
            AttributeError) as e:
        return {"name": name, "conversation": conv, "tools": tools, "add_generation_prompt": agp,
                "kwargs": extra, "error": True, "message": f"{type(e).__name__}: {e}"}


def main() -> int:
    templates = {p.stem: p.read_text(encoding="utf-8") for p in sorted(FIXTURES.glob("*.jinja"))}
    templates["Qwen3-VL-Instruct"] = QWEN3_VL.read_text(encoding="utf-8")
    env = chat_template_utils._compile_jinja_template("{{ 1 }}").environment
    snippets = []
    for src, ctx in SNIPPETS:
        try:
            snippets.append({"template": src, "context": ctx,
                             "rendered": env.from_string(src).render(**ctx)})
        except jinja2.exceptions.TemplateError as e:
            snippets.append({"template": src, "context": ctx, "error": True,
                             "message": f"{type(e).__name__}: {e}"})
    out = {
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "now": FIXED_NOW.strftime("%Y-%m-%dT%H:%M:%S"),
        "bos_token": "<s>",
        "eos_token": "</s>",
        "tools": TOOLS,
        "conversations": CONVERSATIONS,
        "snippets": snippets,
        "templates": {},
    }
    for name, tpl in templates.items():
        file = "../chat_template/chat_template.jinja" if name == "Qwen3-VL-Instruct" else f"{name}.jinja"
        out["templates"][name] = {"file": file, "runs": [render(tpl, r) for r in RUNS]}
        ok = sum(1 for r in out["templates"][name]["runs"] if not r.get("error"))
        print(f"{name}: {ok}/{len(RUNS)} rendered", file=sys.stderr)
    (FIXTURES / "cases.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
