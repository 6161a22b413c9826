"""A Hugging Face Hub-compatible file server for model folders, as a mirror would run it
(a user behind one sets HF_ENDPOINT to its URL). The fast tier (tests/server/test_hub_models.py)
and the node tier (e2e/node/test_hf_model.py) both serve repos with it; a plain module on
sys.path (pyproject: pythonpath = ["tests/helpers"]), which the e2e runs share.

It answers the calls `huggingface_hub.snapshot_download` and `hf_hub_download` make:

    GET  /api/models/ORG/NAME[/revision/REV]          repo info: sha, siblings
    GET  /api/models/ORG/NAME/tree/REV[/PATH]          the file list (recursive)
    HEAD /ORG/NAME/resolve/REV/FILE                    X-Repo-Commit, ETag, size
    GET  /ORG/NAME/resolve/REV/FILE                    the bytes

and records each request's method and path, so a test can see the download happen (or not).
As the Hub does, an unknown repo is a 404 with `X-Error-Code: RepoNotFound`, and a gated repo's
files are a 401 with `X-Error-Code: GatedRepo` to a request without `Authorization: Bearer`.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterable
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
    gated: bool = False

    @classmethod
    def of(cls, repo_id: str, folder: Path, gated: bool = False) -> "HubRepo":
        repo = cls(repo_id, folder, gated=gated)
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            data = f.read_bytes()
            rel = f.relative_to(folder).as_posix()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            repo.files[rel] = HubFile(rel, len(data), hashlib.sha256(data).hexdigest(), blob)
        repo.sha = hashlib.sha1("".join(f.git_oid for f in repo.files.values()).encode()).hexdigest()
        return repo


class HubServer:
    """Serves `repos` on (host, port); start() returns once it listens; close() stops it."""

    def __init__(self, repos: HubRepo | Iterable[HubRepo], host: str = "127.0.0.1", port: int = 0):
        self.repos = {r.repo_id: r for r in ([repos] if isinstance(repos, HubRepo) else repos)}
        self.requests: list[tuple[str, str]] = []
        self.sent: dict[str, int] = {}      # path -> bytes of file content sent (a Range GET sends part)
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

    def seen_bytes(self) -> dict[str, int]:
        with self._lock:
            return dict(self.sent)

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self.sent.clear()

    def count_sent(self, path: str, n: int) -> None:
        with self._lock:
            self.sent[path] = self.sent.get(path, 0) + n

    def repo_of(self, path: str) -> HubRepo | None:
        """The repo a request path names (/api/models/ORG/NAME... or /ORG/NAME/resolve/...)."""
        api = path.startswith("/api/models/")
        org, _, rest = path.removeprefix("/api/models/" if api else "/").partition("/")
        name, _, rest = rest.partition("/")
        repo = self.repos.get(f"{org}/{name}")
        return repo if repo is not None and (api or rest.startswith("resolve/")) else None


def _byte_range(header: str | None, size: int) -> tuple[int | None, int]:
    """A `Range: bytes=FIRST-[LAST]` header as (first, last), or (None, size - 1) without one."""
    if not header or not header.startswith("bytes="):
        return None, size - 1
    first, _, last = header[len("bytes="):].partition("-")
    return int(first), min(int(last) if last else size - 1, size - 1)


def _handler(server: HubServer) -> type[BaseHTTPRequestHandler]:
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
            repo = server.repo_of(path)
            if repo is None:
                return self._json({"error": "Repository not found"}, body, status=404,
                                  headers={"X-Error-Code": "RepoNotFound"})
            api = f"/api/models/{repo.repo_id}"
            resolve = f"/{repo.repo_id}/resolve/"
            if path == api or path.startswith(api + "/revision/"):
                return self._json({"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.sha, "private": False,
                                   "siblings": [{"rfilename": p} for p in repo.files]}, body)
            if path.startswith(api + "/tree/"):
                return self._json([{"type": "file", "path": f.path, "size": f.size, "oid": f.git_oid}
                                   for f in repo.files.values()], body)
            if path.startswith(resolve) and repo.gated and not self.headers.get("Authorization", "").startswith("Bearer "):
                return self._json({"error": f"Access to model {repo.repo_id} is restricted."}, body, status=401,
                                  headers={"X-Error-Code": "GatedRepo",
                                           "X-Error-Message": f"Access to model {repo.repo_id} is restricted."})
            if path.startswith(resolve):
                _rev, _, name = path[len(resolve):].partition("/")
                f = repo.files.get(name)
                if f is not None:
                    headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{f.git_oid}"', "Accept-Ranges": "bytes"}
                    data = (repo.folder / f.path).read_bytes() if body else b""
                    first, last = _byte_range(self.headers.get("Range"), f.size)
                    if first is None:
                        server.count_sent(path, len(data))
                        return self._send(200, data, "application/octet-stream", f.size, headers)
                    data = data[first:last + 1]
                    server.count_sent(path, len(data))
                    return self._send(206, data, "application/octet-stream", last + 1 - first,
                                      {**headers, "Content-Range": f"bytes {first}-{last}/{f.size}"})
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
