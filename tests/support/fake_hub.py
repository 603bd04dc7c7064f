"""A local stand-in for the Hugging Face Hub's HTTP API, serving one directory as one model repo, so
`huggingface_hub` itself downloads it and lays out its cache (no network exists in the tests).

Only what `snapshot_download` asks for: the revision's commit, the file tree, and each file by
HEAD (its metadata headers) and GET. Any other repo is a 404 the library reads as "not found".
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class _Repo:
    def __init__(self, repo_id: str, directory: Path) -> None:
        self.repo_id = repo_id
        self.files = {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}
        self.oids = {name: hashlib.sha1(data).hexdigest() for name, data in self.files.items()}


def _handler(repo: _Repo, requests: list[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            return None

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = unquote(urlparse(self.path).path)
            requests.append(f"{self.command} {path}")
            api = f"/api/models/{repo.repo_id}/"
            resolve = f"/{repo.repo_id}/resolve/"
            if path.startswith(api + "revision/"):
                self._json({"id": repo.repo_id, "sha": COMMIT, "siblings": [{"rfilename": n} for n in repo.files]})
            elif path.startswith(api + "tree/"):
                self._json([{"type": "file", "path": name, "size": len(data), "oid": repo.oids[name]}
                            for name, data in repo.files.items()])
            elif path.startswith(resolve) and path.split("/", 5)[-1] in repo.files:
                name = path.split("/", 5)[-1]
                self._send(200, repo.files[name], "application/octet-stream", body,
                           {"X-Repo-Commit": COMMIT, "ETag": f'"{repo.oids[name]}"'})
            else:
                self._send(404, b'{"error": "Repository not found"}', "application/json", body,
                           {"X-Error-Code": "RepoNotFound"})

        def _json(self, payload: object) -> None:
            self._send(200, json.dumps(payload).encode(), "application/json", True, {})

        def _send(self, status: int, data: bytes, content_type: str, body: bool, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in {"Content-Type": content_type, "Content-Length": str(len(data)), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler


@contextmanager
def fake_hub(repo_id: str, directory: Path) -> Iterator[tuple[str, list[str]]]:
    """(the endpoint URL to give as HF_ENDPOINT, the requests it received) while the block runs."""
    requests: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(_Repo(repo_id, directory), requests))
    thread = threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
