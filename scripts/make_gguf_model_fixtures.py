#!/usr/bin/env python3
"""GGUF fixtures made by llama.cpp's own converter (convert_hf_to_gguf.py) from checkpoints the
repository already holds, into tests/model/fixtures/gguf:

- vision-f32.gguf + vision-f32-mmproj.gguf: tests/model/fixtures/vision-f32 (Qwen3-VL dense,
  DeepStack taps at vision layers 0, 1, 3), its text model and its vision file, F32;
- moe-f32-tie.gguf: tests/model/fixtures/moe-f32-tie (Qwen3-VL MoE, 8 experts, top 2), F32;
- qwen35-f32-b.gguf + qwen35-f32-b-mmproj.gguf: tests/model/fixtures/qwen35-f32-b (Qwen3.5:
  Gated DeltaNet with twice as many value heads as key heads, gated attention), F32;
- qwen35moe-mtp.gguf: tests/model/fixtures/qwen35moe-f32-a (Qwen3.5 MoE with a shared expert)
  with the MTP head of tests/model/fixtures/qwen35-mtp (stored by the converter as one more
  block), F32;
- qwen3-vocab.gguf: the Qwen3 tokenizer of tests/data/tokenizer alone (--vocab-only), for the
  tokenizer read from GGUF against tokenizer.json.

The tiny checkpoints carry no tokenizer; the demo model's (models/tiny-qwen3vl) is copied beside
them. The converter recognises a tokenizer's pre-tokenizer by hashing what it makes of a test
text, and knows only published ones; the demo tokenizer splits text exactly as Qwen's does (its
tokenizer.json has Qwen2's pre-tokenizer), so it is registered as `qwen2` for the run (the only
change to the converter, made in this process). The real Qwen3 tokenizer is recognised as it is.

Usage (outside the repository: llama.cpp's checkout and a virtualenv with its
requirements/requirements-convert_hf_to_gguf.txt, i.e. torch and transformers):
    python scripts/make_gguf_model_fixtures.py --llama-cpp LLAMA_CPP_DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "model" / "fixtures"
OUT = FIXTURES / "gguf"
DEMO = ROOT / "models" / "tiny-qwen3vl"

# Runs the converter with the demo tokenizer's pre-tokenizer registered as Qwen2's.
WRAPPER = """
import runpy, sys
llama = sys.argv.pop(1)
sys.path.insert(0, llama)
sys.path.insert(0, llama + "/gguf-py")
if sys.argv.pop(1) == "qwen2":
    import conversion.base as base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv[0] = llama + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(llama: Path, src: Path, out: Path, *extra: str, register: bool = True) -> None:
    cmd = [sys.executable, "-c", WRAPPER, str(llama), "qwen2" if register else "-", str(src),
           "--outfile", str(out), *extra]
    print(" ".join(cmd[3:]))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def with_demo_tokenizer(fixture: str, tmp: Path) -> Path:
    """The fixture with the demo tokenizer, its vision placeholders moved to the ids the fixture's
    config gives them (its references were made with those ids)."""
    d = tmp / fixture
    d.mkdir()
    for name in ["config.json", "generation_config.json", "model.safetensors"]:
        shutil.copy(FIXTURES / fixture / name, d / name)
    shutil.copy(DEMO / "preprocessor_config.json", d / "preprocessor_config.json")
    config = json.loads((d / "config.json").read_text())
    ids = {"<|image_pad|>": config["image_token_id"], "<|video_pad|>": config["video_token_id"],
           "<|vision_start|>": config["vision_start_token_id"],
           "<|vision_end|>": config["vision_end_token_id"]}
    tok = json.loads((DEMO / "tokenizer.json").read_text())
    for added in tok["added_tokens"]:
        added["id"] = ids.get(added["content"], added["id"])
        # `tokenizers` keeps an added token's id only when the model's vocabulary has it there.
        tok["model"]["vocab"][added["content"]] = added["id"]
    (d / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    # tokenizer.json alone gives the added tokens (tokenizer_config.json's table would disagree).
    tc = json.loads((DEMO / "tokenizer_config.json").read_text())
    tc.pop("added_tokens_decoder", None)
    (d / "tokenizer_config.json").write_text(json.dumps(tc, ensure_ascii=False))
    return d


def with_mtp_head(d: Path, head: Path) -> None:
    """The checkpoint in `d` with the MTP head's tensors in its model.safetensors and
    mtp_num_hidden_layers: 1 in its config, as a published Qwen3.5 checkpoint holds them."""
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(d / "model.safetensors"))
    tensors.update(load_file(str(head)))
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((d / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 1
    (d / "config.json").write_text(json.dumps(config, indent=2))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, type=Path, help="llama.cpp's checkout")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        vision = with_demo_tokenizer("vision-f32", tmp)
        convert(args.llama_cpp, vision, OUT / "vision-f32.gguf", "--outtype", "f32")
        convert(args.llama_cpp, vision, OUT / "vision-f32-mmproj.gguf", "--outtype", "f32",
                "--mmproj")
        moe = with_demo_tokenizer("moe-f32-tie", tmp)
        convert(args.llama_cpp, moe, OUT / "moe-f32-tie.gguf", "--outtype", "f32")
        # Qwen3.5: value heads twice the key heads (the converter reorders them), an untied head,
        # a vision tower without DeepStack; the MoE with its shared expert.
        q35 = with_demo_tokenizer("qwen35-f32-b", tmp)
        convert(args.llama_cpp, q35, OUT / "qwen35-f32-b.gguf", "--outtype", "f32", "--no-mtp")
        convert(args.llama_cpp, q35, OUT / "qwen35-f32-b-mmproj.gguf", "--outtype", "f32",
                "--mmproj")
        # The MoE with its shared expert and an MTP head (the qwen35-mtp fixture's, beside
        # qwen35moe-f32-a's trunk), which the converter stores as one more block.
        mtp = with_demo_tokenizer("qwen35moe-f32-a", tmp)
        with_mtp_head(mtp, FIXTURES / "qwen35-mtp" / "mtp-qwen35moe-f32-a.safetensors")
        convert(args.llama_cpp, mtp, OUT / "qwen35moe-mtp.gguf", "--outtype", "f32")
        vocab = tmp / "qwen3-vocab"
        vocab.mkdir()
        for name in ["tokenizer.json", "tokenizer_config.json"]:
            shutil.copy(ROOT / "tests" / "data" / "tokenizer" / name, vocab / name)
        (vocab / "config.json").write_text(json.dumps({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6}))
        convert(args.llama_cpp, vocab, OUT / "qwen3-vocab.gguf", "--vocab-only", register=False)
    for f in sorted(OUT.glob("*.gguf")):
        print(f"{f.relative_to(ROOT)}: {f.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
