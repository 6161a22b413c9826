"""A Hugging Face Hub-compatible file server for one model folder, as a mirror
would run it (a user behind one sets HF_ENDPOINT to its URL).

It answers the calls `huggingface_hub.snapshot_download` makes:

    GET  /api/models/ORG/NAME[/revision/REV]          repo info: sha, siblings
    GET  /api/models/ORG/NAME/tree/REV[/PATH]          the file list (recursive)
    HEAD /ORG/NAME/resolve/REV/FILE                    X-Repo-Commit, ETag, size
    GET  /ORG/NAME/resolve/REV/FILE                    the bytes

and records each request's method and path, so a test can see the download happen.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True, slots=True)
class HubFile:
    path: str
    size: int
    sha256: str
    git_oid: str   # the git blob id, what the Hub reports as `oid` for small files


@dataclass(slots=True)
class HubRepo:
    repo_id: str
    folder: Path
    files: dict[str, HubFile] = field(default_factory=dict)
    sha: str = ""

    @classmethod
    def of(cls, repo_id: str, folder: Path) -> "HubRepo":
        repo = cls(repo_id, folder)
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            data = f.read_bytes()
            rel = f.relative_to(folder).as_posix()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            repo.files[rel] = HubFile(rel, len(data), hashlib.sha256(data).hexdigest(), blob)
        repo.sha = hashlib.sha1("".join(f.git_oid for f in repo.files.values()).encode()).hexdigest()
        return repo


class HubServer:
    """Serves `repo` on (host, port); start() returns once it listens; close() stops it."""

    def __init__(self, repo: HubRepo, host: str, port: int = 0):
        self.repo = repo
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "HubServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def record(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, path))

    def seen(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self.requests)


def _handler(server: HubServer) -> type[BaseHTTPRequestHandler]:
    repo = server.repo

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # the test reads server.requests instead
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            server.record(self.command, path)
            api = f"/api/models/{repo.repo_id}"
            resolve = f"/{repo.repo_id}/resolve/"
            if path == api or path.startswith(api + "/revision/"):
                return self._json({"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.sha, "private": False,
                                   "siblings": [{"rfilename": p} for p in repo.files]}, body)
            if path.startswith(api + "/tree/"):
                return self._json([{"type": "file", "path": f.path, "size": f.size, "oid": f.git_oid}
                                   for f in repo.files.values()], body)
            if path.startswith(resolve):
                _rev, _, name = path[len(resolve):].partition("/")
                f = repo.files.get(name)
                if f is not None:
                    data = (repo.folder / f.path).read_bytes() if body else b""
                    return self._send(200, data, "application/octet-stream", f.size,
                                      {"X-Repo-Commit": repo.sha, "ETag": f'"{f.git_oid}"'})
            return self._json({"error": f"{path} not found"}, body, status=404,
                              headers={"X-Error-Code": "EntryNotFound"})

        def _json(self, obj, body: bool, status: int = 200, headers: dict | None = None) -> None:
            data = json.dumps(obj).encode()
            self._send(status, data if body else b"", "application/json", len(data), headers or {})

        def _send(self, status: int, data: bytes, ctype: str, length: int, headers: dict) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(length))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if data:
                self.wfile.write(data)

    return Handler
