"""A local stand-in for the Hugging Face Hub's file API, on 127.0.0.1 only, serving model folders
by id, for the tests of loading a model by Hub id (HF_ENDPOINT points at it).

It answers what huggingface_hub (file_download.py, hf_api.py) asks:
- HEAD / GET /{org}/{name}/resolve/{revision}/{path}: the file, with the headers
  `hf_hub_download` requires (ETag, X-Repo-Commit, Content-Length); a missing file is 404 with
  X-Error-Code: EntryNotFound (and X-Repo-Commit, so the absence is cached); an unknown repo is 404
  with X-Error-Code: RepoNotFound;
- GET /api/models/{org}/{name}[/revision/{revision}]: the model's info (id, sha, siblings);
- GET /api/models/{org}/{name}/tree/{revision}[/{path}]: the files under path (a folder the repo
  lacks is 404 EntryNotFound).
Every request is recorded (method, path) in `requests`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")


class HubServer:
    """Serves `repos` ({"org/name": folder}) as the Hub does, until `stop()`."""

    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                outer._answer(self, body=False)

            def do_GET(self) -> None:
                outer._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def files(self, repo: str) -> list[str]:
        root = self.repos[repo]
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append((h.command, path))
        if m := RESOLVE.match(path):
            return self._file(h, m["repo"], m["path"], body)
        if m := TREE.match(path):
            return self._tree(h, m["repo"], m["path"] or "")
        if m := API.match(path):
            if m["repo"] not in self.repos:
                return _send(h, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
            info = {
                "id": m["repo"],
                "modelId": m["repo"],
                "sha": COMMIT,
                "private": False,
                "gated": False,
                "siblings": [{"rfilename": f} for f in self.files(m["repo"])],
            }
            return _send(h, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        return _send(h, 404, b"not found", {}, body)

    def _file(self, h: BaseHTTPRequestHandler, repo: str, name: str, body: bool) -> None:
        if repo not in self.repos:
            return _send(h, 404, b"Repository not found", {"X-Error-Code": "RepoNotFound"}, body)
        f = self.repos[repo] / name
        if not f.is_file():
            headers = {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}
            return _send(h, 404, b"Entry not found", headers, body)
        data = f.read_bytes()
        headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": COMMIT}
        _send(h, 200, data, headers, body)

    def _tree(self, h: BaseHTTPRequestHandler, repo: str, under: str) -> None:
        if repo not in self.repos:
            return _send(h, 404, b"Repository not found", {"X-Error-Code": "RepoNotFound"})
        files = [f for f in self.files(repo) if not under or f.startswith(under.rstrip("/") + "/")]
        if under and not files:
            return _send(h, 404, b"Entry not found", {"X-Error-Code": "EntryNotFound"})
        entries = [{"type": "file", "path": f, "size": (self.repos[repo] / f).stat().st_size} for f in files]
        _send(h, 200, json.dumps(entries).encode(), {"Content-Type": "application/json"})


def _send(h: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict, body: bool = True) -> None:
    h.send_response(status)
    for k, v in headers.items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    if body:
        h.wfile.write(data)
