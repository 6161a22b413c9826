"""A GGUF file's config and tokenizer as Hugging Face files, converted once and cached.

The engine and the gateway speak Hugging Face files (config.json, tokenizer.json,
tokenizer_config.json, chat_template.jinja; the gateway gets the tokenizer ones over
GET /v1/cache/tokenizer and has no transformers). A GGUF keeps all of it as metadata,
so we convert: the config with engine/gguf/config.py, the tokenizer with transformers'
own GGUF tokenizer builder (AutoTokenizer.from_pretrained(dir, gguf_file=...), then
save_pretrained). Using transformers' converter itself is what makes our token ids and
rendered chats equal to transformers' for the same file; it costs seconds (importing
transformers, building 49K merges), so the result is cached:

    <cache>/gguf/<sha256 of the file>-v<CONVERTER_VERSION>/   config.json, tokenizer files, done.json

Keyed by content, never by path or mtime, so a changed file can never meet a stale
conversion; CONVERTER_VERSION changes when what we write changes. Hashing the file costs
~0.35 s a start for the default model (~3 s per GB), so the hash itself is remembered under
<cache>/gguf/hashes/, keyed by the file's identity: device, inode, size, mtime and ctime in
nanoseconds. Any write to the file moves its ctime (no call sets it back), and a replaced
file has a new inode: either means a new key and a fresh hash. Made under a lock per
file content (engine/cache_lock.py), so of two engines starting together (`pagedkube up`
starts two, pods of a node share a cache) one converts and the other waits and finds the
result; written into a temporary sibling and renamed into place, so no reader ever sees a
half-written folder. The weights are not cached: they are dequantized
from the file at every load (engine/gguf/weights.py), which takes about as long as
reading a converted copy would.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from pagedkube.engine.cache_lock import cache_lock

log = logging.getLogger(__name__)

CONVERTER_VERSION = 1
DONE_FILE = "done.json"
CACHE_ENV = "PAGEDKUBE_CACHE_DIR"
HASH_LOG_BYTES = 1 << 30     # hashing a file this big takes seconds: say so


def cache_root() -> Path:
    """$PAGEDKUBE_CACHE_DIR, else $XDG_CACHE_HOME/pagedkube, else ~/.cache/pagedkube; a folder
    under the system temp dir when that is not writable (a read-only container root)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pagedkube"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "pagedkube-cache"


def write_tokenizer_files(gguf_path: Path, out_dir: Path) -> None:
    """transformers' tokenizer for this GGUF, saved as the files pagedkube.tokenizer reads."""
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ValueError("converting a GGUF tokenizer needs transformers (pip install 'pagedkube[engine]')") from e
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except (ValueError, KeyError, OSError) as e:
        raise ValueError(f"{gguf_path.name}: cannot build its tokenizer from the GGUF metadata: {e}") from None
    tok.save_pretrained(str(out_dir))
    if not (out_dir / "tokenizer.json").is_file():
        raise ValueError(f"{gguf_path.name}: transformers wrote no tokenizer.json for this GGUF")


def file_sha256(path: Path) -> str:
    """engine/gguf/reader.py's, imported only when a file is hashed: the lookups here need no
    numpy (the HTTP process makes them, converted_model_dir)."""
    from pagedkube.engine.gguf.reader import file_sha256 as sha256

    return sha256(path)


def _identity(path: Path, root: Path) -> tuple[str, Path]:
    """(the file's identity, the record of its hash under root/hashes)."""
    st = path.stat()
    identity = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    return identity, root / "hashes" / f"{hashlib.sha256(identity.encode()).hexdigest()}.json"


def _recorded(identity: str, memo: Path) -> str | None:
    """The sha256 the record holds for this identity; None when there is none, or it is
    unreadable or for another identity."""
    try:
        known = json.loads(memo.read_text())
        if known.get("identity") == identity and len(known.get("sha256", "")) == 64:
            return known["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    return None


def remembered_sha256(path: Path, root: Path) -> str | None:
    """The file's sha256 if a record of it matches the file's identity now; else None."""
    return _recorded(*_identity(path, root))


def content_sha256(path: Path, root: Path) -> str:
    """The file's sha256, remembered under root/hashes by the file's identity (module docstring)."""
    identity, memo = _identity(path, root)
    known = _recorded(identity, memo)
    if known is not None:
        return known
    st = path.stat()
    if st.st_size >= HASH_LOG_BYTES:
        log.info("hashing %s (%.1f GB) to find its conversion", path.name, st.st_size / 1e9)
    sha = file_sha256(path)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"identity": identity, "sha256": sha, "name": path.name}))
        tmp.replace(memo)
    except OSError as e:                              # a read-only cache: hash again next time
        log.debug("cannot remember the hash of %s: %s", path, e)
    return sha


def converted_model_dir(gguf_path: str | Path) -> Path | None:
    """The converted folder for this file if the cache has it and remembers the file's hash;
    None otherwise. Reads two small files: no hashing, no conversion, no lock."""
    path = Path(gguf_path)
    root = cache_root() / "gguf"
    sha = remembered_sha256(path, root)
    out = root / f"{sha}-v{CONVERTER_VERSION}"
    return out if sha is not None and (out / DONE_FILE).is_file() else None


def gguf_model_dir(gguf_path: str | Path) -> Path:
    """The converted folder for this file (made now if the cache lacks it)."""
    path = Path(gguf_path)
    root = cache_root() / "gguf"
    sha = content_sha256(path, root)
    out = root / f"{sha}-v{CONVERTER_VERSION}"
    if (out / DONE_FILE).is_file():
        return out
    from pagedkube.engine.gguf.config import gguf_config
    from pagedkube.engine.gguf.reader import GGUFFile

    f = GGUFFile(path)
    config = gguf_config(f)      # unsupported architectures fail here, before any conversion
    f.check_types()
    with cache_lock(root / f"{out.name}.lock", f"converting {path.name}") as waited:
        if (out / DONE_FILE).is_file():     # another process converted it meanwhile
            log.info("%s: converted by another process%s; using %s", path.name,
                     " while this one waited" if waited else "", out)
            return out
        _convert(path, sha, config, root, out)
    return out


def _convert(path: Path, sha: str, config: dict, root: Path, out: Path) -> None:
    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}-", dir=root))
    try:
        log.info("converting %s (sha256 %s) into %s", path.name, sha[:12], out)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        write_tokenizer_files(path, tmp)
        (tmp / DONE_FILE).write_text(json.dumps({"sha256": sha, "source_name": path.name,
                                                 "converter_version": CONVERTER_VERSION}))
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted %s in %.1f s", path.name, time.monotonic() - start)
