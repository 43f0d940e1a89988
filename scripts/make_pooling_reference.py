#!/usr/bin/env python3
"""Pooling references for tests/model/fixtures/vision-f32/: what an embedding model pools and a
reranker scores, recorded with transformers on the fixture checkpoint.

For each of the fixture's image prompts (reference.json "cases", preprocessed exactly as
make_vision_reference.py does) and one text-only prompt, it records the hidden state of the last
prompt token after the text decoder's final norm — ``Qwen3VLModel``'s ``last_hidden_state[0, -1]``,
which Qwen3-VL-Embedding pools (and normalises) and Qwen3-VL-Reranker multiplies by
lm_head's "yes" row minus its "no" row — and the logits there of two ids standing for "no" and
"yes", into pooling_reference.json. CPU, float32, attn_implementation="eager", deterministic.

Usage (transformers 4.57.1, torch, as in scripts/requirements-reference.txt):
    python scripts/make_pooling_reference.py            # a few seconds
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import transformers

import make_reference as mr
import make_vision_reference as mv

NO_YES = [5, 7]  # two ids of the 1024-vocabulary fixture, standing for a reranker's "no", "yes"


def main() -> int:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = mr.load(mv.OUT, torch.float32)
    images = mv.preprocess()
    t = mv.TEMPLATE_IDS
    text_only = dict(name="text_only", images=[],
                     prompt_ids=[t["im_start"], t["user"], t["newline"], 321, 654, 987, 123,
                                 t["im_end"], t["newline"], t["im_start"], t["assistant"],
                                 t["newline"]])
    out = dict(transformers_version=transformers.__version__, torch_version=torch.__version__,
               dtype="float32", attn_implementation="eager",
               what="last_hidden_state[0, -1] of Qwen3VLModel (after the final norm), and the "
                    "logits of logit_ids at the last position",
               logit_ids=NO_YES, cases=[])
    for case in mv.cases() + [text_only]:
        if case["images"]:
            ids, extra = mv.case_inputs(case, images)
        else:
            ids, extra = case["prompt_ids"], {}
        with torch.no_grad():
            inp = torch.tensor([ids], dtype=torch.long)
            hidden = model.model(input_ids=inp, **extra).last_hidden_state[0, -1]
            logits = model(input_ids=inp, **extra).logits[0, -1]
        out["cases"].append(dict(name=case["name"], images=case["images"],
                                 prompt_ids=case["prompt_ids"],
                                 hidden=[round(float(v), 7) for v in hidden],
                                 logits=[round(float(logits[i]), 7) for i in NO_YES]))
        # The head is the lm_head row product of that very hidden state.
        assert np.allclose((model.lm_head.weight[NO_YES] @ hidden).detach().numpy(),
                           [logits[i].item() for i in NO_YES], atol=1e-5)
    (mv.OUT / "pooling_reference.json").write_text(json.dumps(out, indent=1) + "\n",
                                                   encoding="utf-8")
    print(f"wrote {mv.OUT / 'pooling_reference.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
