"""The Qwen3-VL demo model (models/tiny-qwen3vl) as GGUF, written here by scripts/write_gguf.py
(the PyPI `gguf` package, llama.cpp's layout): `vlm run -m tiny.gguf --mmproj tiny-mmproj.gguf`
answers the 100 held-out scenes of tests/model/fixtures/shapes-qa exactly as transformers does
(and so as vlm does from the safetensors checkpoint) at F32, and states its accuracy at Q8_0
(its rows, 128 and 320 wide, are not multiples of 256: the K-quants do not apply to it).
`vlm serve` takes the same two files and answers a chat with a picture as `vlm run` does.

That the writer lays the files out as llama.cpp's converter does: on a checkpoint the converter
wrote (tests/model/fixtures/gguf/vision-f32*.gguf), its files hold the same tensors (names,
types, shapes, bytes) and the same model and vision metadata.
"""

import argparse
import base64
import json
import subprocess
import sys
import tempfile
import unittest
import urllib.request
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
import serve_util  # noqa: E402

ARGS = argparse.Namespace(vlm=None, model_dir=None)
REPO = serve_util.REPO
SCENES = REPO / "tests/model/fixtures/shapes-qa"
WRITER = REPO / "scripts/write_gguf.py"


def write(ckpt: Path, out: Path, qtype: str, tokenizer: Path | None = None) -> None:
    cmd = [sys.executable, str(WRITER), str(ckpt), str(out), "--type", qtype]
    if tokenizer is not None:
        cmd += ["--tokenizer", str(tokenizer)]
    subprocess.run(cmd, check=True)


# The demo model's image budget (its preprocessor_config.json's size): a GGUF file does not
# store it, so its user gives it, as a llama.cpp user would.
MIN_PIXELS, MAX_PIXELS = 4096, 25600


def ask(model: Path, image: Path, question: str) -> str:
    r = subprocess.run([ARGS.vlm, "run", "--greedy", "-n", "32", "-t", "2", "-m", f"{model}.gguf",
                        "--mmproj", f"{model}-mmproj.gguf", "--image", str(image),
                        "--min-pixels", str(MIN_PIXELS), "--max-pixels", str(MAX_PIXELS),
                        "-p", question],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"vlm run failed: {r.stderr}")
    return r.stdout.rstrip("\n")


class DemoGguf(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = Path(cls.tmp.name)
        for qtype in ("f32", "q8_0"):
            write(REPO / "models/tiny-qwen3vl", cls.dir / f"tiny-{qtype}", qtype)
        cls.cases = json.loads((SCENES / "cases-tiny-qwen3vl.json").read_text())

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_writer_lays_files_out_as_the_converter(self):
        fixture = REPO / "tests/model/fixtures/vision-f32"
        write(fixture, self.dir / "vision", "f32", REPO / "models/tiny-qwen3vl")
        for ours, theirs in (("vision.gguf", "vision-f32.gguf"),
                             ("vision-mmproj.gguf", "vision-f32-mmproj.gguf")):
            a = gguf.GGUFReader(str(self.dir / ours))
            b = gguf.GGUFReader(str(REPO / "tests/model/fixtures/gguf" / theirs))
            ta = {t.name: t for t in a.tensors}
            tb = {t.name: t for t in b.tensors}
            self.assertEqual(sorted(ta), sorted(tb), ours)
            for name, t in tb.items():
                self.assertEqual(ta[name].tensor_type, t.tensor_type, name)
                self.assertEqual(list(ta[name].shape), list(t.shape), name)
                self.assertEqual(ta[name].data.tobytes(), t.data.tobytes(), name)
            # The model's and vision tower's keys (not general.*, the converter's naming; not
            # tokenizer.*: the converter's file has the fixture's placeholder ids moved).
            keys = [k for k in b.fields if k.split(".")[0] not in ("general", "GGUF", "tokenizer")]
            self.assertGreater(len(keys), 10)
            for k in keys:
                self.assertIn(k, a.fields, k)
                self.assertEqual(a.fields[k].contents(), b.fields[k].contents(), k)

    def test_f32_answers_every_scene_as_transformers(self):
        right = 0
        for c in self.cases["cases"]:
            got = ask(self.dir / "tiny-f32", SCENES / c["image"], c["question"])
            self.assertEqual(got, c["transformers"], f"{c['image']}: {c['question']}")
            right += got == c["truth"]
        self.assertGreaterEqual(len(self.cases["cases"]), 100)
        print(f"[demo GGUF F32] accuracy {right / len(self.cases['cases']):.3f} "
              f"(transformers {self.cases['transformers_accuracy']:.3f})")

    def test_q8_0_accuracy(self):
        right = same = 0
        for c in self.cases["cases"]:
            got = ask(self.dir / "tiny-q8_0", SCENES / c["image"], c["question"])
            right += got == c["truth"]
            same += got == c["transformers"]
        n = len(self.cases["cases"])
        print(f"[demo GGUF Q8_0] accuracy {right / n:.3f} (transformers at F32 "
              f"{self.cases['transformers_accuracy']:.3f}); {same} of {n} answers as at F32")
        # Q8_0 rounds each weight to 8 bits and a scale per 32: the answers may move a little.
        self.assertGreaterEqual(right / n, self.cases["transformers_accuracy"] - 0.05)

    def test_serve_answers_a_picture_as_run(self):
        c = self.cases["cases"][1]
        image = SCENES / c["image"]
        model = self.dir / "tiny-f32"
        server = serve_util.VlmServer(ARGS.vlm, f"{model}.gguf", self.tmp.name, "serve",
                                      ["--mmproj", f"{model}-mmproj.gguf"])
        try:
            url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
            body = {"model": serve_util.MODEL, "max_tokens": 32, "temperature": 0,
                    "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS,
                    "messages": [{"role": "user", "content": [
                        {"type": "image_url", "image_url": {"url": url}},
                        {"type": "text", "text": c["question"]}]}]}
            req = urllib.request.Request(server.url("/v1/chat/completions"),
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=serve_util.TIMEOUT) as r:
                reply = json.loads(r.read())["choices"][0]["message"]["content"]
        finally:
            server.stop()
        self.assertEqual(reply, c["transformers"])


def main():
    serve_util.run_tests(ARGS, __doc__)


if __name__ == "__main__":
    main()
