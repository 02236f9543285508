"""Tiny local stand-ins for an OpenAI-compatible server, on 127.0.0.1 only, for the server backend's
tests: a scripted one (answers from a Python function, records every request, counts requests in
flight), one that answers HTTP 500 to everything, one that accepts connections and never answers,
and a port where nothing listens."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Answer = Callable[[str, dict], tuple[int, Any]]  # (path, JSON body) -> (status, JSON answer)


class ScriptedServer:
    """A threaded HTTP server whose answers come from `answer(path, body)`; `requests` holds
    (method, path, body, headers) of each request, `max_inflight` the most handled at once."""

    def __init__(self, answer: Answer, *, delay: float = 0.0) -> None:
        self.answer = answer
        self.delay = delay
        self.requests: list[tuple[str, str, dict, dict]] = []
        self.inflight = 0
        self.max_inflight = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _handle(self, method: str) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size) or b"{}") if size else {}
                with outer._lock:
                    outer.requests.append((method, self.path, body, dict(self.headers)))
                    outer.inflight += 1
                    outer.max_inflight = max(outer.max_inflight, outer.inflight)
                try:
                    if outer.delay:
                        time.sleep(outer.delay)
                    status, data = outer.answer(self.path, body)
                finally:
                    with outer._lock:
                        outer.inflight -= 1
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def posts(self, path: str = "/v1/completions") -> list[dict]:
        return [body for method, p, body, _ in self.requests if method == "POST" and p == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def completion(
    texts: list[str],
    *,
    prompt_tokens: int = 10,
    completion_tokens: int | None = None,
    cached: int | None = None,
    top: dict[str, float] | None = None,
) -> dict:
    """A /v1/completions answer: one choice per text, each token a character, logprob -0.1 each."""
    choices = []
    for i, text in enumerate(texts):
        tokens = list(text) or [""]
        choices.append(
            {
                "index": i,
                "text": text,
                "finish_reason": "stop",
                "logprobs": {
                    "tokens": tokens,
                    "token_logprobs": [-0.1] * len(tokens),
                    "text_offset": list(range(len(tokens))),
                    "top_logprobs": [dict(top) if top is not None else {t: -0.1} for t in tokens],
                },
            }
        )
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens
        if completion_tokens is not None
        else sum(len(t) for t in texts),
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"object": "text_completion", "choices": choices, "usage": usage}


def models(owned_by: str = "vllm") -> dict:
    return {"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": owned_by}]}


def always(status: int, data: Any) -> Answer:
    return lambda path, body: (status, data)


class HangingServer:
    """Accepts TCP connections and never answers (a stuck server)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self._held.append(conn)

    def connections(self) -> list[socket.socket]:
        """The connections accepted so far (one per attempt)."""
        return list(self._held)

    def close(self) -> None:
        self._stop.set()
        for c in self._held:
            c.close()
        self.sock.close()


def free_port() -> int:
    """A 127.0.0.1 port where nothing listens (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused_url() -> str:
    """The URL of a 127.0.0.1 port where nothing listens."""
    return f"http://127.0.0.1:{free_port()}/v1"


def default_gguf_or_skip() -> Path:
    """The default model's GGUF file for a real server to load; the test skips, saying how to install
    it, when it is absent."""
    import pytest

    from treesearch.common.errors import ModelNotInstalledError
    from treesearch.models.load import default_gguf_path

    try:
        return default_gguf_path()
    except ModelNotInstalledError as err:
        pytest.skip(str(err))
