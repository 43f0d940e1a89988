#!/usr/bin/env python3
"""Compare vlm's logits with transformers' on a checkpoint too large for the committed fixtures.

    python scripts/compare_checkpoint.py --model CKPT_DIR --vlm build/tools/cli/vlm

For the random full-width checkpoints of scripts/make_random_checkpoint.py (e.g. the 235B-A22B
shape with --layers 1, or qwen3.5-9b with --layers 4 and --lengths 1,7,150: a prompt across
several 64-token chunks of the delta rule). Runs `vlm logits` (exact f32 products, f32 KV cache)
first, then transformers in float32 with eager attention (4.57.1 for Qwen3-VL,
scripts/requirements-reference.txt; 5.x for Qwen3.5, scripts/requirements-reference-qwen35.txt),
one process after the other so that only one copy of the weights is in memory. Prints, per prompt,
max |Δ| / max |logit| and the argmax agreement, and fails above --tol (1e-4, the fixtures' bound).
Transformers holds the weights in float32: about 4 bytes per parameter of RAM. With
--experts-as-stored the fused expert tensors of a mixture-of-experts checkpoint stay in the
checkpoint's BF16 (two full-width 235B-A22B layers are 19 GB of experts in float32) and each
Qwen3VLMoeTextExperts module multiplies one expert at a time with its weights converted to
float32: the same products as transformers' float32 run, summed over the chosen experts in
index order (transformers' eval path adds zero-weighted products of the others too); every
other weight is float32 as before (those the file holds in float32, such as Qwen3.5's A_log and
gated norm weights, read from it again: loading in BF16 rounded them). Qwen3.5's
Qwen3_5MoeExperts (35b-a3b, transformers 5.x) are replaced the same way.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


EXPERT_TENSORS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def _experts_forward_f32(self, hidden_states, routing_weights, router_indices):
    """Qwen3VLMoeTextExperts.forward with BF16-held experts multiplied in float32."""
    import torch
    batch = hidden_states.shape[0]
    h = hidden_states.reshape(-1, self.hidden_size)
    out = torch.zeros_like(h)
    for e in range(self.num_experts):
        w = routing_weights[:, e]
        if not bool((w != 0).any()):
            continue
        gate, up = (h @ self.gate_up_proj[e].float()).chunk(2, dim=-1)
        out += ((up * self.act_fn(gate)) @ self.down_proj[e].float()) * w[:, None]
    return out.view(batch, -1, self.hidden_size)


def _qwen35_experts_forward_f32(self, hidden_states, top_k_index, top_k_weights):
    """Qwen3_5MoeExperts.forward (experts in nn.Linear's layout, [E, 2I, H] and [E, H, I]) with
    BF16-held experts multiplied in float32, the chosen experts in index order as transformers
    adds them."""
    import torch
    out = torch.zeros_like(hidden_states)
    for e in sorted(set(top_k_index.flatten().tolist())):
        pos, tok = torch.where(top_k_index.T == e)
        h = hidden_states[tok]
        gate, up = torch.nn.functional.linear(h, self.gate_up_proj[e].float()).chunk(2, dim=-1)
        y = torch.nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e].float())
        out.index_add_(0, tok, y * top_k_weights[tok, pos, None])
    return out


def stored_f32(ckpt: Path) -> dict:
    """The checkpoint's tensors stored in float32 (Qwen3.5's A_log and gated norms), exactly."""
    from safetensors import safe_open
    out = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                if st.get_slice(name).get_dtype() == "F32":
                    out[name] = st.get_tensor(name)
    return out


def experts_as_stored(model, ckpt: Path) -> None:
    """Every parameter to float32 but the fused expert tensors, whose modules multiply one
    expert at a time in float32. The model was loaded in BF16 (so that the experts stay so), which
    rounded the tensors the file stores in float32: those are read again from the file."""
    import types

    import torch
    n = 0
    exact = stored_f32(ckpt)
    params = dict(model.named_parameters())
    for name, p in params.items():
        if not name.endswith(EXPERT_TENSORS):
            p.data = exact[name].reshape(p.shape) if name in exact else p.data.float()
    # Every F32 tensor of the file that the model has must have been taken as stored (a name
    # mapped otherwise would silently keep its BF16 rounding).
    layers = tuple(f"model.language_model.layers.{i}."
                   for i in range(model.config.get_text_config().num_hidden_layers))
    unused = [name for name in exact if name.startswith(layers) and name not in params]
    assert not unused, f"float32 tensors of the file not matched to parameters: {unused[:4]}"
    for mod in model.modules():
        for key, b in mod._buffers.items():  # rotary tables: built in float32 at init
            assert b is None or not b.is_floating_point() or b.dtype == torch.float32, key
        if type(mod).__name__ == "Qwen3VLMoeTextExperts":
            mod.forward = types.MethodType(_experts_forward_f32, mod)
            n += 1
        if type(mod).__name__ == "Qwen3_5MoeExperts":
            mod.forward = types.MethodType(_qwen35_experts_forward_f32, mod)
            n += 1
    assert n > 0, "no Qwen3VLMoeTextExperts or Qwen3_5MoeExperts module"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="checkpoint directory")
    ap.add_argument("--vlm", type=Path, required=True, help="the vlm binary")
    ap.add_argument("--lengths", default="1,7,24", help="prompt lengths, a comma list")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--experts-as-stored", action="store_true",
                    help="keep fused expert tensors in BF16, multiply them in float32")
    args = ap.parse_args()

    cfg = json.loads((args.model / "config.json").read_text())
    vocab = cfg.get("text_config", cfg)["vocab_size"]
    rng = np.random.default_rng(args.seed)
    # Ordinary tokens only (below the Qwen specials at 151643).
    prompts = [rng.integers(0, min(vocab, 151643), size=int(n)).tolist()
               for n in args.lengths.split(",")]

    ours = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, ids in enumerate(prompts):
            out = Path(tmp) / f"{i}.npy"
            t0 = time.time()
            subprocess.run([str(args.vlm), "logits", "-m", str(args.model), "--ids",
                            ",".join(map(str, ids)), "--out", str(out), "--precision", "f32",
                            "--kv-cache-dtype", "f32", "-t", str(args.threads)], check=True)
            ours.append(np.load(out))
            print(f"vlm: {len(ids)} ids in {time.time() - t0:.1f}s", flush=True)

    import torch
    import transformers

    torch.set_num_threads(args.threads or torch.get_num_threads())
    t0 = time.time()
    cls = getattr(transformers, cfg["architectures"][0])
    if args.experts_as_stored:
        model = cls.from_pretrained(args.model, dtype=torch.bfloat16, attn_implementation="eager")
        experts_as_stored(model, args.model)
    else:
        model = cls.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.is_floating_point() and t.dtype != torch.float32:
            assert name.endswith(EXPERT_TENSORS), name
    print(f"transformers {transformers.__version__}: loaded in {time.time() - t0:.1f}s",
          flush=True)
    worst = 0.0
    with torch.no_grad():
        for ids, got in zip(prompts, ours):
            x = torch.tensor([ids])
            want = model(input_ids=x, attention_mask=torch.ones_like(x),
                         use_cache=False).logits[0].float().numpy()
            assert got.shape == want.shape, (got.shape, want.shape)
            rel = float(np.abs(got - want).max() / np.abs(want).max())
            agree = float((got.argmax(-1) == want.argmax(-1)).mean())
            worst = max(worst, rel)
            print(f"{len(ids):4d} ids: max|d|/max|logit| {rel:.2e}, argmax agreement "
                  f"{agree:.3f}, max|logit| {np.abs(want).max():.3f}", flush=True)
    ok = worst <= args.tol
    print(f"{'ok' if ok else 'FAIL'}: worst {worst:.2e} (tolerance {args.tol:.0e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
