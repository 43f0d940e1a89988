#!/usr/bin/env python3
"""Build the MTP-head reference fixtures (tests/model/fixtures/qwen35-mtp) with transformers 5.x.

Qwen3.5 checkpoints carry a multi-token-prediction head (top-level ``mtp.*`` tensors) that
transformers does not run (it skips ``mtp.*`` on load), so its reference forward is written here
in torch, from vLLM's ``vllm/model_executor/models/qwen3_5_mtp.py`` (Qwen3_5MultiTokenPredictor)
and ``vllm/v1/spec_decode/eagle.py`` (how the proposer feeds and chains it):

* one row per position p: the next token's embedding (the model's own table) and the model's
  last hidden state at p *after its final norm*, each through its own zero-centred RMSNorm
  (``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``: scale by 1 + w), concatenated in that
  order, ``fc`` (2·hidden → hidden, no bias), one full-attention decoder layer built by the
  model's own class (gated attention, q/k norms, the model's partial interleaved M-RoPE at p's
  position, the dense MLP or the sparse block of an MoE model), causal over the rows, then
  ``mtp.norm`` and the model's head;
* chained for more proposals: the next row is the last proposal (its argmax) with the MTP's own
  output for it (after ``mtp.norm``), at the next position.

For each of the fixtures qwen35-f32-a (dense, tied head) and qwen35moe-f32-a (mixture of experts
with a shared expert), a random MTP head (seeded; normal weights, norms around 0) is written to
``mtp-<fixture>.safetensors`` under the names of the published checkpoints, and for each prompt
(random ids, text only) reference.json records the prompt, the model's greedy next token, the K − 1
chained proposals, and the logits of every row: the prompt's (``<fixture>_<case>_rows.npy``,
[len, vocab]: row p predicts the token at p + 2) and the chained ones
(``<fixture>_<case>_chain.npy``, [K − 1, vocab]).

Usage (a virtualenv outside the repository with scripts/requirements-reference-qwen35.txt):
    python scripts/make_mtp_reference.py
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoModelForImageTextToText

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "model" / "fixtures"
OUT = FIXTURES / "qwen35-mtp"
MODELS = ["qwen35-f32-a", "qwen35moe-f32-a"]
PROMPTS = [7, 40]  # prompt lengths
K = 4              # proposals: the first and K - 1 chained


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3_5RMSNorm: computed in f32, scaled by (1 + w)."""
    v = x.float()
    v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    return (v * (1.0 + w.float())).to(x.dtype)


class MtpHead(torch.nn.Module):
    def __init__(self, model, seed: int):
        super().__init__()
        text = model.config.text_config
        self.eps = text.rms_norm_eps
        H = text.hidden_size
        cfg = copy.deepcopy(text)
        cfg.layer_types = ["full_attention"]
        cfg.num_hidden_layers = 1
        cfg._attn_implementation = "eager"
        trunk = model.model.language_model
        full = next(i for i, t in enumerate(text.layer_types) if t == "full_attention")
        torch.manual_seed(seed)
        self.layer = type(trunk.layers[full])(cfg, 0)
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.norm_embedding = torch.nn.Parameter(torch.zeros(H))
        self.norm_hidden = torch.nn.Parameter(torch.zeros(H))
        self.norm = torch.nn.Parameter(torch.zeros(H))
        with torch.no_grad():
            for name, p in list(self.layer.named_parameters()) + [("fc", self.fc.weight)]:
                if "norm" in name:
                    p.normal_(0.0, 0.1)
                elif p.dim() >= 2:
                    p.normal_(0.0, 0.08)
                else:
                    p.normal_(0.0, 0.02)
            for p in (self.norm_embedding, self.norm_hidden, self.norm):
                p.normal_(0.0, 0.1)
        self.embed = trunk.embed_tokens
        self.rotary = trunk.rotary_emb
        self.head = model.lm_head

    def tensors(self) -> dict[str, torch.Tensor]:
        """The head under the published checkpoints' names."""
        t = {"mtp.fc.weight": self.fc.weight,
             "mtp.pre_fc_norm_embedding.weight": self.norm_embedding,
             "mtp.pre_fc_norm_hidden.weight": self.norm_hidden,
             "mtp.norm.weight": self.norm}
        for name, p in self.layer.state_dict().items():
            t["mtp.layers.0." + name] = p
        return {k: v.detach().contiguous().clone() for k, v in t.items()}

    def forward(self, next_ids, hidden, positions):
        """Rows (hidden p, token p + 1) at positions p: their output after mtp.norm, logits."""
        e = rms_norm(self.embed(next_ids), self.norm_embedding, self.eps)
        h = rms_norm(hidden, self.norm_hidden, self.eps)
        x = self.fc(torch.cat([e, h], dim=-1))
        n = x.shape[1]
        pos3 = positions.view(1, 1, -1).expand(3, 1, -1)
        cos_sin = self.rotary(x, pos3)
        mask = torch.full((n, n), float("-inf")).triu(1).view(1, 1, n, n)
        x = self.layer(x, position_embeddings=cos_sin, attention_mask=mask, position_ids=None)
        g = rms_norm(x, self.norm, self.eps)
        return g, self.head(g)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    ref = {"k": K, "generator": {"transformers": __import__("transformers").__version__,
                                 "torch": torch.__version__, "dtype": "float32"},
           "cases": []}
    for mi, name in enumerate(MODELS):
        model = AutoModelForImageTextToText.from_pretrained(
            str(FIXTURES / name), dtype=torch.float32, attn_implementation="eager").eval()
        head = MtpHead(model, seed=1000 + mi).eval()
        save_file(head.tensors(), str(OUT / f"mtp-{name}.safetensors"))
        vocab = model.config.text_config.vocab_size
        gen = torch.Generator().manual_seed(77 + mi)
        for ci, length in enumerate(PROMPTS):
            ids = torch.randint(0, 400, (1, length), generator=gen)  # below the special ids
            with torch.no_grad():
                out = model.model(input_ids=ids)
                hidden = out.last_hidden_state  # after the final norm
                nxt = int(model.lm_head(hidden[:, -1]).argmax(-1))
                pos = torch.arange(length)
                next_ids = torch.cat([ids[:, 1:], torch.tensor([[nxt]])], dim=1)
                g, logits = head(next_ids, hidden, pos)
                rows = logits[0].clone()
                proposals = [int(rows[-1].argmax())]
                chain = []
                # Chained: the last proposal with the MTP's output for it, one position on.
                for d in range(1, K):
                    next_ids = torch.cat([next_ids, torch.tensor([[proposals[-1]]])], dim=1)
                    hidden = torch.cat([hidden, g[:, -1:]], dim=1)
                    pos = torch.cat([pos, pos[-1:] + 1])
                    g, logits = head(next_ids, hidden, pos)
                    chain.append(logits[0, -1].clone())
                    proposals.append(int(logits[0, -1].argmax()))
            stem = f"{name}_{ci}"
            np.save(OUT / f"{stem}_rows.npy", rows.numpy().astype(np.float32))
            np.save(OUT / f"{stem}_chain.npy", torch.stack(chain).numpy().astype(np.float32))
            top = torch.stack(chain).topk(2, dim=-1).values
            ref["cases"].append({"model": name, "case": ci, "prompt": ids[0].tolist(),
                                 "next_token": nxt, "proposals": proposals,
                                 "chain_margins": (top[:, 0] - top[:, 1]).tolist(),
                                 "rows": f"{stem}_rows.npy", "chain": f"{stem}_chain.npy",
                                 "vocab": vocab})
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
