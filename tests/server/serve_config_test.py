"""`vlm serve --config FILE.yaml` (keys: the long option names, as vLLM's --config): the file's
options apply, an option on the command line wins over the file, and a key that is no option, a
nested value or a file that is not YAML is an error naming it, before anything loads."""

import argparse
import json
import subprocess
import tempfile
import unittest
import urllib.error
import urllib.request
from pathlib import Path

import serve_util

ARGS = argparse.Namespace(vlm=None, model_dir=None)


def get(server, path, key=None):
    req = urllib.request.Request(server.url(path))
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())


class ServeConfig(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.work = Path(cls.tmp.name)
        cls.model = serve_util.make_model_dir(ARGS.model_dir, cls.work / "model")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def write(self, name, text):
        p = self.work / name
        p.write_text(text)
        return p

    def test_file_applies_and_the_command_line_wins(self):
        """The file sets api-key (underscores for dashes: max_num_seqs), ctx and a list of served
        model names; the command line gives -c and --served-model-name too: /v1/models says the
        command line's name and context, and requests need the file's key."""
        cfg = self.write("serve.yaml", "api-key: sekrit\nctx: 256\nmax_num_seqs: 2\n"
                                       "served-model-name: [from-file, other]\nno-webui: true\n")
        server = serve_util.VlmServer(ARGS.vlm, self.model, self.work, "config",
                                      extra_args=["--config", str(cfg)])
        try:
            with self.assertRaises(urllib.error.HTTPError) as e:
                get(server, "/v1/models")
            self.assertEqual(e.exception.code, 401)
            status, models = get(server, "/v1/models", key="sekrit")
            self.assertEqual(status, 200)
            self.assertEqual([m["id"] for m in models["data"]], [serve_util.MODEL])
            self.assertEqual(models["data"][0]["max_model_len"], serve_util.CTX)
            with self.assertRaises(urllib.error.HTTPError) as e:  # --no-webui from the file
                urllib.request.urlopen(server.url("/"), timeout=30)
            self.assertEqual(e.exception.code, 404)
        finally:
            server.stop()

    def test_bad_files_are_refused_naming_what(self):
        cases = {
            "unknown key": ("port: 0\nmax-num-seq: 4\n", "unknown key 'max-num-seq'"),
            "nested value": ("port:\n  a: 1\n", "port"),
            "not a mapping": ("- port\n- 0\n", "not a mapping"),
            "not YAML": ("port: [0\n", "not YAML"),
            "missing file": (None, "missing.yaml"),
        }
        for what, (text, needle) in cases.items():
            with self.subTest(what):
                path = self.work / "missing.yaml" if text is None else self.write("bad.yaml", text)
                r = subprocess.run([ARGS.vlm, "serve", "-m", str(self.model), "--config", str(path)],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn(needle, r.stderr)
                self.assertNotIn("serving on", r.stderr)


if __name__ == "__main__":
    serve_util.run_tests(ARGS, __doc__)
