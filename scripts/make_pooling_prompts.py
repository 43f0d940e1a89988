#!/usr/bin/env python3
"""The prompts of Qwen3-VL-Embedding and Qwen3-VL-Reranker, rendered by transformers' tokenizer
with the Qwen3-VL chat template, into tests/model/fixtures/chat_template/pooling_prompts.json.

The messages are laid out as the models' own code (QwenLM/Qwen3-VL-Embedding) lays them out:
- embedding: a system message holding the instruction (stripped; a full stop appended when its
  last character is not Unicode punctuation; empty: "Represent the user's input."), then a user
  message with the input's videos, images and text in that order, or the text "NULL" when there
  is nothing; add_generation_prompt=True.
- reranking: the fixed system message, then one user message of text parts "<Instruct>: " +
  instruction, "<Query>:", the query's videos, images and text (or "NULL"), "\\n<Document>:",
  the document's likewise; add_generation_prompt=True.
Each case records the rendered text and its token ids (special tokens parsed, as the processor
does), for vlm's own prompt builders (vlm/pooling.h) to equal.

Usage (transformers 4.57.1, as in scripts/requirements-reference.txt):
    python scripts/make_pooling_prompts.py
"""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests/model/fixtures/chat_template/pooling_prompts.json"
EMBED_DEFAULT = "Represent the user's input."
RERANK_DEFAULT = "Given a search query, retrieve relevant candidates that answer the query."
RERANK_SYSTEM = ("Judge whether the Document meets the requirements based on the Query and the "
                 "Instruct provided. Note that the answer can only be \"yes\" or \"no\".")


def parts(side: dict) -> list[dict]:
    out = [{"type": "video"} for _ in range(side.get("videos", 0))]
    out += [{"type": "image"} for _ in range(side.get("images", 0))]
    if side.get("text"):
        out.append({"type": "text", "text": side["text"]})
    return out


def embed_messages(inp: dict, instruction: str, parts=parts) -> list[dict]:
    """`parts(side)`: the side's content items (here placeholders; the server references' carry
    their media)."""
    instruction = instruction.strip()
    if instruction and not unicodedata.category(instruction[-1]).startswith("P"):
        instruction += "."
    content = parts(inp) or [{"type": "text", "text": "NULL"}]
    return [{"role": "system", "content": [{"type": "text", "text": instruction or EMBED_DEFAULT}]},
            {"role": "user", "content": content}]


def rerank_messages(query: dict, doc: dict, instruction: str, parts=parts) -> list[dict]:
    content = [{"type": "text", "text": "<Instruct>: " + (instruction or RERANK_DEFAULT)},
               {"type": "text", "text": "<Query>:"}]
    content += parts(query) or [{"type": "text", "text": "NULL"}]
    content.append({"type": "text", "text": "\n<Document>:"})
    content += parts(doc) or [{"type": "text", "text": "NULL"}]
    return [{"role": "system", "content": [{"type": "text", "text": RERANK_SYSTEM}]},
            {"role": "user", "content": content}]


def main() -> int:
    tok = AutoTokenizer.from_pretrained(REPO / "tests/data/tokenizer")
    template = (REPO / "tests/model/fixtures/chat_template/chat_template.jinja").read_text()

    def render(messages):
        text = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                       add_generation_prompt=True)
        return text, tok(text, add_special_tokens=False)["input_ids"]

    embed = []
    for inp, instr in [
        ({"text": "A woman playing with her dog on a beach at sunset."}, ""),
        ({"text": "A woman playing with her dog."},
         "Retrieve images or text relevant to the user's query."),
        ({"text": "a cat", "images": 1}, "Find the cat"),
        ({"text": "two clips and a photo", "videos": 2, "images": 1}, "  spaced out  "),
        ({"images": 1}, "Costs in $"),
        ({}, "中文指令。"),
        ({"text": "x"}, "括号（注）"),
        ({"text": "y"}, "said \"so\""),
        ({"text": "z"}, "a + b"),
    ]:
        text, ids = render(embed_messages(inp, instr))
        embed.append(dict(input=inp, instruction=instr, text=text, ids=ids))
    rerank = []
    for query, doc, instr in [
        ({"text": "A cat standing in the snow."},
         {"text": "This product was excellent and exceeded my expectations."}, ""),
        ({"text": "A woman playing with her dog on a beach at sunset."}, {"images": 1},
         "Retrieve images or text relevant to the user's query."),
        ({"text": "q", "images": 1}, {"text": "d", "images": 2, "videos": 1}, "Judge it"),
        ({}, {}, ""),
    ]:
        text, ids = render(rerank_messages(query, doc, instr))
        rerank.append(dict(query=query, document=doc, instruction=instr, text=text, ids=ids))
    out = dict(note="rendered by transformers' apply_chat_template with the Qwen3-VL chat "
                    "template (chat_template.jinja), add_generation_prompt=True; ids with special "
                    "tokens parsed",
               yes=tok.convert_tokens_to_ids("yes"), no=tok.convert_tokens_to_ids("no"),
               embed=embed, rerank=rerank)
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
