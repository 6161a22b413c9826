"""A Hub model's files, from huggingface_hub's cache or downloaded into it.

huggingface_hub does the work and keeps its own contract: the cache is $HF_HUB_CACHE (default
$HF_HOME/hub, $HF_HOME default ~/.cache/huggingface), HF_TOKEN authenticates, HF_ENDPOINT names a
mirror, HF_HUB_OFFLINE=1 forbids the network; downloads resume from `.incomplete` blobs and each
blob is written under its own file lock, so two engines fetching one model never write a file
twice. What we add:

- **The cache first.** A name whose files the cache holds in full for the revision it names
  (`refs/<branch>` -> commit, that commit's cached tree listing, every file we read present)
  is served without contacting the Hub at all, online or not, as Ollama serves a pulled model.
  huggingface_hub's own default (and vLLM's) asks the Hub for the branch's head on every start;
  a fleet restarting against a rate-limited or unreachable Hub is what we avoid. A newer commit
  of a branch is fetched by naming it (`ORG/NAME@COMMIT`) or by `hf download ORG/NAME`, which
  moves the cached ref.
- **Only the files the engine reads** (pagedkube.hub_model.choose_files).
- **Checks before the weights**: config.json's architecture (the caller's check_config), then free
  disk for the bytes still missing.
- **Errors a user can act on**, one line each (HubError, a ValueError): unknown repo, gated repo
  without a token, no network, offline with a cold cache, disk full.
- **Progress**: huggingface_hub's bars on a terminal; otherwise a log line every
  PROGRESS_INTERVAL_S with the bytes so far, and one when done.
"""
from __future__ import annotations

import errno
import json
import logging
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from pagedkube.hub_model import HubFiles, HubModel, choose_adapter_files, choose_files, gguf_architecture, parse_hub_model

log = logging.getLogger("pagedkube.hub")

PROGRESS_INTERVAL_S = 5.0   # a log line this often while a download runs off a terminal
# Bytes of a GGUF read first, for its architecture: its metadata starts with general.*; the
# tokenizer's arrays that follow can be megabytes and are not needed.
GGUF_HEAD_BYTES = 256 * 1024


def log_progress_to_stderr() -> None:
    """For commands that configure no logging (generate, up): this module's lines on stderr."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class HubError(ValueError):
    """A Hub model that cannot be had, said in one line a user can act on."""


Chooser = Callable[[HubModel, Any], HubFiles]   # which files of a repo to fetch (hub_model.choose_*)


def fetch_hub_model(model: HubModel, check_config: Callable[[dict[str, Any]], None] | None = None,
                    check_gguf: Callable[[str], None] | None = None, choose: Chooser = choose_files) -> Path:
    """The local path of `model`: its GGUF file, or its snapshot folder (a Hugging Face directory).
    Before any weight is downloaded, `check_config` sees a checkpoint's config.json and
    `check_gguf` a GGUF's architecture (both raise ValueError for what the engine cannot serve)."""
    from huggingface_hub import constants

    cached = cached_hub_model(model, offline=constants.HF_HUB_OFFLINE, choose=choose)
    if cached is not None:
        log.info("%s: using the cached %s (no Hub request)", model.name, cached)
        return cached
    if constants.HF_HUB_OFFLINE:
        raise HubError(f"{model.name} is not in the Hugging Face cache {constants.HF_HUB_CACHE} and HF_HUB_OFFLINE "
                       f"is set: download it once online (unset HF_HUB_OFFLINE), or point HF_HOME at a cache "
                       f"that holds it")
    import httpx2
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    try:
        return _download(model, check_config, check_gguf, choose)
    except HubError:
        raise
    except ValueError as e:
        if not isinstance(e, HfHubHTTPError):   # choose_files' and check_config's own lines
            raise HubError(f"{model.name}: {e}") from None
        raise HubError(hub_error_message(model, e)) from None
    except (OSError, httpx2.TransportError, EntryNotFoundError) as e:   # the Hub's, network's and disk's
        raise HubError(hub_error_message(model, e)) from None


def cached_hub_model(model: HubModel, offline: bool = False, choose: Chooser = choose_files) -> Path | None:
    """The model's path when the cache holds every file of it we read, else None (no network).

    Complete means: the revision's commit (refs/), that commit's file listing as huggingface_hub
    cached it (trees/, written by snapshot_download since 1.x), every file we read present.
    A snapshot without a cached listing (made by an older huggingface_hub, or by hand) cannot be
    called complete: online it is refreshed once through the Hub (which writes the listing);
    `offline`, the snapshot's own files stand in for the listing, as huggingface_hub does."""
    from huggingface_hub import get_cached_repo_tree, snapshot_download
    from huggingface_hub.errors import CachedRepoTreeNotFoundError, LocalEntryNotFoundError

    try:
        try:
            listing = [f.path for f in get_cached_repo_tree(model.repo_id, revision=model.revision)]
        except CachedRepoTreeNotFoundError:
            if not offline:
                return None
            listing = None
        if listing is None:      # no listing to check against: snapshot_download returns the folder as it is
            folder = Path(snapshot_download(model.repo_id, revision=model.revision, local_files_only=True))
            files = choose(model, [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()])
        else:                    # raises IncompleteSnapshotError unless every file we read is there
            files = choose(model, listing)
            folder = Path(snapshot_download(model.repo_id, revision=model.revision,
                                            allow_patterns=list(files.paths), local_files_only=True))
        if not all((folder / p).is_file() for p in files.paths):
            return None
    except (LocalEntryNotFoundError, ValueError):
        return None
    return _local_path(folder, files)


def resolve_adapter_path(path: str) -> str:
    """A LoRA adapter path as vLLM takes one: a local folder as it is, else a Hub repo id
    (ORG/NAME[@REV], hf:// allowed) fetched into the cache like a model (its two PEFT files only),
    its snapshot folder returned. Blocks on the network: call it off the event loop. HubError
    (a ValueError) when the Hub cannot give it; a path that is neither is returned for the
    adapter reader to refuse."""
    if Path(path).expanduser().exists():
        return path
    hub = parse_hub_model(path)
    if hub is None or hub.quant or hub.filename:
        return path
    return str(fetch_hub_model(hub, choose=choose_adapter_files))


def _local_path(folder: Path, files: HubFiles) -> Path:
    return folder / files.gguf if files.gguf else folder


def _download(model: HubModel, check_config: Callable[[dict[str, Any]], None] | None,
              check_gguf: Callable[[str], None] | None, choose: Chooser) -> Path:
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.hf_api import RepoFile

    api = HfApi()
    info = api.model_info(model.repo_id, revision=model.revision)
    assert info.sha is not None, "the Hub answers a model's commit"
    sizes = {f.path: f.size for f in api.list_repo_tree(model.repo_id, revision=info.sha, recursive=True)
             if isinstance(f, RepoFile)}
    files = choose(model, sizes)
    if check_config is not None and "config.json" in files.paths:
        config = Path(hf_hub_download(model.repo_id, "config.json", revision=info.sha))
        check_config(json.loads(config.read_text()))
    storage = _storage_folder(model.repo_id)
    snapshot = storage / "snapshots" / info.sha
    if check_gguf is not None and files.gguf is not None:
        local = snapshot / files.gguf
        if local.is_file():
            with open(local, "rb") as f:
                head = f.read(GGUF_HEAD_BYTES)
        else:
            head = _head(model, info.sha, files.gguf)
        arch = gguf_architecture(head)
        if arch is not None:
            check_gguf(arch)
    missing = {p: sizes[p] for p in files.paths if not (snapshot / p).is_file()}
    _check_disk(model, storage, sum(missing.values()))
    need = sum(missing.values())
    if missing:
        log.info("%s: downloading %d file(s), %d bytes (%s) of commit %s into %s", model.name, len(missing),
                 need, _human(need), info.sha[:12], storage)
    else:
        log.info("%s: every file of commit %s is in the cache %s; recording its listing", model.name,
                 info.sha[:12], storage)
    start = time.monotonic()
    with ProgressLog(model.name, storage / "blobs", need) as progress:
        folder = snapshot_download(model.repo_id, revision=model.revision, allow_patterns=list(files.paths),
                                   tqdm_class=None if progress.on_terminal else _silent_tqdm())
    if missing:
        log.info("%s: downloaded %d bytes in %.1f s", model.name, need, time.monotonic() - start)
    return _local_path(Path(folder), files)


def _head(model: HubModel, sha: str, filename: str) -> bytes:
    """The first GGUF_HEAD_BYTES of a file, by one range request (the rest is never read)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = {**build_hf_headers(), "Range": f"bytes=0-{GGUF_HEAD_BYTES - 1}"}
    data = bytearray()
    with get_session().stream("GET", hf_hub_url(model.repo_id, filename, revision=sha), headers=headers,
                              follow_redirects=True) as response:
        hf_raise_for_status(response)
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) >= GGUF_HEAD_BYTES:    # a server that ignores Range: stop reading here
                break
    return bytes(data[:GGUF_HEAD_BYTES])


def _storage_folder(repo_id: str) -> Path:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")


def _check_disk(model: HubModel, storage: Path, need: int) -> None:
    storage.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(storage).free
    if need > free:
        raise HubError(f"{model.name} needs {_human(need)} but {storage} has {_human(free)} free: make room or "
                       f"point HF_HOME at a larger disk")


def hub_error_message(model: HubModel, e: BaseException) -> str:
    """One line for huggingface_hub's and the network's errors (the message a user acts on)."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    if isinstance(e, GatedRepoError):
        return (f"{model.repo_id} is a gated repo: accept its terms on the Hub, then set HF_TOKEN to a token of "
                f"that account (or run `hf auth login`)")
    if isinstance(e, RepositoryNotFoundError):
        return (f"{model.repo_id} is neither a local path nor a model repo on {constants.ENDPOINT} (a private repo "
                f"needs HF_TOKEN); check the name")
    if isinstance(e, RevisionNotFoundError):
        return f"{model.repo_id} has no revision {model.revision!r}"
    if isinstance(e, (httpx2.TransportError, OfflineModeIsEnabled)):
        return (f"cannot reach {constants.ENDPOINT} to download {model.name} ({type(e).__name__}: {e}); check the "
                f"network or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use only the cache")
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return f"the disk filled while downloading {model.name} into {_storage_folder(model.repo_id)}: make room"
    if isinstance(e, HfHubHTTPError):
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"the Hub refused {model.name}: {first}"
    return f"cannot fetch {model.name}: {type(e).__name__}: {e}".splitlines()[0]


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    raise AssertionError("unreachable")


def _silent_tqdm() -> type:
    """huggingface_hub's progress bar class, never drawn (off a terminal its carriage returns
    would fill the log; ProgressLog writes lines instead)."""
    from huggingface_hub.utils.tqdm import tqdm

    class Silent(tqdm):
        def __init__(self, *args: Any, **kwargs: Any):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent


class ProgressLog:
    """Off a terminal, logs the bytes written into the repo's blobs folder (huggingface_hub writes
    each file there as BLOB.incomplete, then renames it) every PROGRESS_INTERVAL_S; on a terminal
    huggingface_hub's own bars show the same."""

    def __init__(self, name: str, blobs: Path, total: int, interval: float = PROGRESS_INTERVAL_S):
        self.name, self.blobs, self.total, self.interval = name, blobs, total, interval
        self.on_terminal = sys.stderr.isatty()
        self.stop = threading.Event()
        self.base = self._bytes()
        self.thread = threading.Thread(target=self._run, name="hub-progress", daemon=True)

    def _bytes(self) -> int:
        try:
            return sum(p.stat().st_size for p in self.blobs.iterdir() if p.is_file())
        except OSError:
            return 0

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            done = min(self._bytes() - self.base, self.total)
            log.info("%s: downloading, %d of %d bytes (%s of %s)", self.name, done, self.total,
                     _human(done), _human(self.total))

    def __enter__(self) -> "ProgressLog":
        if not self.on_terminal:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
