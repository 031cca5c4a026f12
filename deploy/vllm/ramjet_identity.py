"""ramjet identity contract for vLLM: an ASGI middleware (docs/identity.md).

It answers ``GET /ramjet/identity`` in the engine's own server (no extra hop)
with one JSON object carrying the digests of what the engine loaded and the
engine-instance id; every other request passes to the app untouched.

With vLLM (``vllm serve --middleware ramjet_identity.RamjetIdentityMiddleware``,
this file on PYTHONPATH) the middleware is built with the app only, so it is
configured from the environment:

  RAMJET_MODEL_DIR        the local model directory vLLM loaded (default: the
                          model path in vLLM's app state, when it is a local
                          directory)
  RAMJET_CHAT_TEMPLATE    a chat template file passed to vLLM with
                          --chat-template (default: the template in
                          tokenizer_config.json or chat_template.jinja)
  RAMJET_INSTANCE_ID      the engine-instance id (default: the host name; set
                          it to the pod UID from the downward API)
  RAMJET_MODEL_SHA256, RAMJET_CHAT_TEMPLATE_SHA256, RAMJET_TOKENIZER_SHA256
                          precomputed digests (skip hashing the weights)

The digests are computed once, in a background thread, from the files on
disk; until they are ready the endpoint answers 503 (ramjet keeps the replica
out). ``python3 ramjet_identity.py <model_dir> [--chat-template FILE]`` prints
the digests, for ramjet's pins.
"""

import hashlib
import json
import os
import socket
import sys
import threading

CONTRACT = "ramjet.identity/v1"
PATH = "/ramjet/identity"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_CHUNK = 1 << 20


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(_CHUNK)
            if not b:
                return h.hexdigest()
            h.update(b)


def weights_sha256(model_dir):
    """SHA-256 of the weights manifest: one line "<relpath>\\0<sha256>\\n" per
    weight file under model_dir, sorted by relative POSIX path."""
    entries = []
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if name.endswith(WEIGHT_SUFFIXES):
                full = os.path.join(root, name)
                rel = os.path.relpath(full, model_dir).replace(os.sep, "/")
                entries.append((rel, full))
    if not entries:
        raise ValueError("no weight files under %s" % model_dir)
    h = hashlib.sha256()
    for rel, full in sorted(entries):
        h.update(("%s\0%s\n" % (rel, file_sha256(full))).encode("utf-8"))
    return h.hexdigest()


def chat_template_text(model_dir, template_file=None):
    """The chat template the engine applies: the --chat-template file, else
    tokenizer_config.json's chat_template (the "default" one of a list), else
    chat_template.jinja."""
    if template_file:
        with open(template_file, encoding="utf-8") as f:
            return f.read()
    cfg = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(cfg):
        with open(cfg, encoding="utf-8") as f:
            t = json.load(f).get("chat_template")
        if isinstance(t, list):
            t = next((x.get("template") for x in t if x.get("name") == "default"), None)
        if isinstance(t, str):
            return t
    jinja = os.path.join(model_dir, "chat_template.jinja")
    if os.path.exists(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    raise ValueError("no chat template in %s" % model_dir)


def compute_identity(model_dir, template_file=None, instance_id=None, model_name=None, env=None):
    """The identity answer for the model in model_dir."""
    env = os.environ if env is None else env
    ident = {
        "contract": CONTRACT,
        "model": model_name or os.path.basename(os.path.normpath(model_dir)),
        "model_sha256": env.get("RAMJET_MODEL_SHA256") or weights_sha256(model_dir),
        "chat_template_sha256": env.get("RAMJET_CHAT_TEMPLATE_SHA256")
        or hashlib.sha256(chat_template_text(model_dir, template_file).encode("utf-8")).hexdigest(),
        "instance_id": instance_id or env.get("RAMJET_INSTANCE_ID") or socket.gethostname(),
    }
    tok = env.get("RAMJET_TOKENIZER_SHA256")
    if not tok and os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        tok = file_sha256(os.path.join(model_dir, "tokenizer.json"))
    if tok:
        ident["tokenizer_sha256"] = tok
    return ident


def _vllm_model_dir(app):
    """The model path in vLLM's app state, when it is a local directory."""
    state = getattr(app, "state", None)
    cfg = getattr(state, "vllm_config", None)
    path = getattr(getattr(cfg, "model_config", None), "model", None)
    if isinstance(path, str) and os.path.isdir(path):
        return path
    return None


class RamjetIdentityMiddleware:
    """ASGI middleware serving GET /ramjet/identity.

    identity: a precomputed answer (dict), or None to compute it from
    model_dir / the environment / vLLM's app state on the first request,
    in a background thread (503 until it is ready, or with the error)."""

    def __init__(self, app, identity=None, model_dir=None, template_file=None, env=None):
        self.app = app
        self._env = os.environ if env is None else env
        self._model_dir = model_dir or self._env.get("RAMJET_MODEL_DIR")
        self._template = template_file or self._env.get("RAMJET_CHAT_TEMPLATE")
        self._identity = identity
        self._error = None
        self._lock = threading.Lock()
        self._thread = None
        if identity is None and self._model_dir:
            self._start()

    def _start(self):
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._compute, daemon=True)
            self._thread.start()

    def _compute(self):
        try:
            ident = compute_identity(self._model_dir, self._template, env=self._env)
        except Exception as e:  # reported by the endpoint; ramjet fails closed
            with self._lock:
                self._error = "%s: %s" % (type(e).__name__, e)
            return
        with self._lock:
            self._identity = ident

    def wait(self, timeout=None):
        """Block until the background computation ended (tests, scripts)."""
        t = self._thread
        if t is not None:
            t.join(timeout)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") != PATH:
            await self.app(scope, receive, send)
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _respond(send, 405, {"error": "only GET is allowed on " + PATH}, scope)
            return
        if self._identity is None and self._thread is None:
            self._model_dir = self._model_dir or _vllm_model_dir(scope.get("app"))
            if self._model_dir:
                self._start()
        with self._lock:
            ident, err = self._identity, self._error
        if ident is None:
            msg = err or ("identity not ready" if self._model_dir else "no local model directory: set RAMJET_MODEL_DIR")
            await _respond(send, 503, {"error": msg}, scope)
            return
        await _respond(send, 200, ident, scope)


async def _respond(send, status, obj, scope):
    body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else body})


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: ramjet_identity.py <model_dir> [--chat-template FILE]", file=sys.stderr)
        return 2
    template = None
    if "--chat-template" in argv:
        i = argv.index("--chat-template")
        template = argv[i + 1]
        del argv[i:i + 2]
    ident = compute_identity(argv[0], template)
    json.dump(ident, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
