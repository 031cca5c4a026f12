"""Tests of the ramjet identity middleware with Starlette (Debian's
python3-starlette and python3-httpx): python3 -m unittest test_ramjet_identity

With RAMJET_IDENTITY_DUMP=<file> set, the answer served for the fixture
model is written there, so that the Go test (middleware_test.go) checks it
with ramjet's own client code."""

import hashlib
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from starlette.applications import Starlette  # noqa: E402
from starlette.responses import PlainTextResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

import ramjet_identity as ri  # noqa: E402


def sha(b):
    return hashlib.sha256(b).hexdigest()


def make_model(d, template="{{ messages }}"):
    os.makedirs(os.path.join(d, "sub"))
    files = {"model-00001-of-00002.safetensors": b"w1" * 1000, "sub/model-00002-of-00002.safetensors": b"w2",
             "config.json": b"{}", "tokenizer.json": b'{"vocab":{}}'}
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": template}, f)
    return files


def app_with(mw_kwargs):
    async def hello(request):
        return PlainTextResponse("engine")

    app = Starlette(routes=[Route("/v1/models", hello), Route("/ramjet/other", hello)])
    app.add_middleware(ri.RamjetIdentityMiddleware, **mw_kwargs)
    return app


class IdentityTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.files = make_model(self.dir)

    def tearDown(self):
        self.tmp.cleanup()

    def expected_weights(self):
        # The manifest, spelled out: sorted relative paths of weight files.
        lines = "".join("%s\0%s\n" % (n, sha(self.files[n])) for n in sorted(
            ["model-00001-of-00002.safetensors", "sub/model-00002-of-00002.safetensors"]))
        return sha(lines.encode())

    def client(self, env):
        app = app_with({"env": env})
        c = TestClient(app)
        c.get("/v1/models")  # build the middleware stack
        return c, app

    def test_serves_identity_and_passes_through(self):
        env = {"RAMJET_MODEL_DIR": self.dir, "RAMJET_INSTANCE_ID": "pod-123"}
        c, _ = self.client(env)
        mw = _middleware(c.app)
        mw.wait(10)
        r = c.get(ri.PATH)
        self.assertEqual(r.status_code, 200, r.text)
        got = r.json()
        self.assertEqual(got["contract"], ri.CONTRACT)
        self.assertEqual(got["model_sha256"], self.expected_weights())
        self.assertEqual(got["chat_template_sha256"], sha(b"{{ messages }}"))
        self.assertEqual(got["tokenizer_sha256"], sha(self.files["tokenizer.json"]))
        self.assertEqual(got["instance_id"], "pod-123")
        self.assertEqual(c.get("/v1/models").text, "engine")
        self.assertEqual(c.get("/ramjet/other").text, "engine")
        self.assertEqual(c.post(ri.PATH).status_code, 405)
        dump = os.environ.get("RAMJET_IDENTITY_DUMP")
        if dump:
            with open(dump, "w") as f:
                json.dump({"served": got, "pins": ri.compute_identity(self.dir, env=env)}, f)

    def test_template_changes_digest(self):
        a = ri.compute_identity(self.dir, env={})
        t = os.path.join(self.dir, "other.jinja")
        with open(t, "w") as f:
            f.write("{{ other }}")
        b = ri.compute_identity(self.dir, template_file=t, env={})
        self.assertNotEqual(a["chat_template_sha256"], b["chat_template_sha256"])
        self.assertEqual(a["model_sha256"], b["model_sha256"])

    def test_weights_change_digest(self):
        a = ri.weights_sha256(self.dir)
        with open(os.path.join(self.dir, "sub/model-00002-of-00002.safetensors"), "wb") as f:
            f.write(b"tampered")
        self.assertNotEqual(a, ri.weights_sha256(self.dir))

    def test_not_ready_or_failed_is_503(self):
        c, _ = self.client({})  # no model directory anywhere
        r = c.get(ri.PATH)
        self.assertEqual(r.status_code, 503)
        self.assertIn("RAMJET_MODEL_DIR", r.json()["error"])
        empty = tempfile.mkdtemp(dir=self.dir)
        c, _ = self.client({"RAMJET_MODEL_DIR": empty})
        _middleware(c.app).wait(10)
        r = c.get(ri.PATH)
        self.assertEqual(r.status_code, 503)
        self.assertIn("no weight files", r.json()["error"])

    def test_precomputed_digests(self):
        env = {"RAMJET_MODEL_DIR": self.dir, "RAMJET_MODEL_SHA256": "a" * 64, "RAMJET_CHAT_TEMPLATE_SHA256": "b" * 64}
        got = ri.compute_identity(self.dir, env=env)
        self.assertEqual((got["model_sha256"], got["chat_template_sha256"]), ("a" * 64, "b" * 64))


def _middleware(app):
    """The RamjetIdentityMiddleware instance in a built Starlette stack."""
    m = app.middleware_stack
    while m is not None and not isinstance(m, ri.RamjetIdentityMiddleware):
        m = getattr(m, "app", None)
    if m is None:
        raise AssertionError("middleware not in the stack")
    return m


if __name__ == "__main__":
    unittest.main()
