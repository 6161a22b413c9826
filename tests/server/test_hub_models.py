"""`pagedkube serve ORG/NAME` and `ORG/NAME:QUANT` against a local Hub mirror (tests/helpers/hfhub.py),
as real server processes answering the official openai client.

Each start gets its own environment: HF_HOME (the cache), HF_ENDPOINT (the mirror), and never
HF_TOKEN or HF_HUB_OFFLINE unless the test sets them. The mirror's request log is what says
whether a start downloaded, and what.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import openai
import pytest

from pagedkube.hub_download import GGUF_HEAD_BYTES

from gguf_factory import write_tiny_gguf
from hfhub import HubRepo, HubServer
from model_factory import BUILTIN_TINY

from .conftest import ServerProcess, free_port

ORG = "pagedkube-test"
CHAT = f"{ORG}/tiny-chat"          # the built-in toy as a safetensors repo
GGUFS = f"{ORG}/tiny-gguf"         # two quants of a tiny llama GGUF
GATED = f"{ORG}/gated-chat"
GPT2 = f"{ORG}/gpt2-shaped"        # an architecture the engine does not implement
HUGE = f"{ORG}/huge-chat"          # claims a petabyte of weights
GEMMA = f"{ORG}/gemma-gguf"        # a GGUF of an architecture the engine does not implement
ENGINE_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json"}   # the toy's files but README.md
Q4_1_FILE, Q8_0_FILE = "tiny-chat.Q4_1.gguf", "tiny-chat.Q8_0.gguf"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("repos")
    gguf_dir = root / "gguf"
    gguf_dir.mkdir()
    write_tiny_gguf(gguf_dir / Q4_1_FILE, "llama", "Q4_1")
    write_tiny_gguf(gguf_dir / Q8_0_FILE, "llama", "Q8_0")
    gpt2 = root / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    (gpt2 / "model.safetensors").write_bytes(b"\0" * 4096)
    gemma = root / "gemma"
    gemma.mkdir()
    write_foreign_gguf(gemma / "gemma.F32.gguf", "gemma3")
    huge = HubRepo.of(HUGE, BUILTIN_TINY)
    huge.files["model.safetensors"] = replace(huge.files["model.safetensors"], size=10**15)
    server = HubServer([HubRepo.of(CHAT, BUILTIN_TINY), HubRepo.of(GGUFS, gguf_dir),
                        HubRepo.of(GATED, BUILTIN_TINY, gated=True), HubRepo.of(GPT2, gpt2), huge,
                        HubRepo.of(GEMMA, gemma)]).start()
    yield server
    server.close()


def write_foreign_gguf(path: Path, arch: str) -> None:
    """A GGUF whose metadata says `arch`, with 1 MiB of weights: more than the header read."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_tensor("token_embd.weight", np.zeros((512, 512), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hub_env(hub: HubServer, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**env, "HF_HOME": str(home / "hf"), "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1",
            "PAGEDKUBE_CACHE_DIR": str(home / "pagedkube"), **extra}


def downloads(hub: HubServer) -> list[str]:
    """The files the mirror sent (GETs of /ORG/NAME/resolve/REV/FILE), as /ORG/NAME/FILE, once each."""
    return sorted({re.sub(r"/resolve/[^/]+/", "/", p) for m, p in hub.seen() if m == "GET" and "/resolve/" in p})


def bytes_sent(hub: HubServer) -> dict[str, int]:
    """/ORG/NAME/FILE -> bytes of it the mirror sent."""
    return {re.sub(r"/resolve/[^/]+/", "/", p): n for p, n in hub.seen_bytes().items()}


def chat(server: ServerProcess) -> tuple[list[str], str]:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=client.models.list().data[0].id, messages=HELLO,
                                           max_tokens=8, temperature=0)
    assert reply.usage.completion_tokens > 0
    return [m.id for m in client.models.list().data], reply.choices[0].message.content


def serve(tmp_path: Path, name: str, model: str, env: dict[str, str]) -> ServerProcess:
    return ServerProcess(tmp_path, "--model", model, "--max-model-len", "256", name=name, env=env).start()


def test_a_hub_repo_downloads_once_then_starts_from_the_cache_online_and_offline(hub, tmp_path) -> None:
    env = hub_env(hub, tmp_path)
    hub.clear()
    first = serve(tmp_path, "first", CHAT, env)
    try:
        assert chat(first)[0] == [CHAT]
        answer = chat(first)[1]
    finally:
        first.stop()
    sizes = {name: (BUILTIN_TINY / name).stat().st_size for name in ENGINE_FILES}
    assert downloads(hub) == sorted(f"/{CHAT}/{name}" for name in ENGINE_FILES)   # no README.md
    log = first.log()
    rest = sum(size for name, size in sizes.items() if name != "config.json")     # config.json came first
    assert f"{CHAT}: downloading 4 file(s), {rest} bytes" in log, log
    assert f"{CHAT}: downloaded {rest} bytes in " in log, log

    for offline in ("0", "1"):   # HF_HUB_OFFLINE unset (the same, "0") and set: no request either way
        hub.clear()
        again = serve(tmp_path, f"again-{offline}", CHAT, {**env, "HF_HUB_OFFLINE": offline})
        try:
            assert chat(again) == ([CHAT], answer)
        finally:
            again.stop()
        assert hub.seen() == [], again.log()
        assert f"{CHAT}: using the cached " in again.log()


def test_a_gguf_in_a_hub_repo_by_its_quant_downloads_only_that_file(hub, tmp_path) -> None:
    env = hub_env(hub, tmp_path)
    hub.clear()
    first = serve(tmp_path, "first", f"{GGUFS}:q4_1", env)      # the tag is case-insensitive, as llama.cpp's
    try:
        models, answer = chat(first)
    finally:
        first.stop()
    assert models == [f"{GGUFS}:q4_1"]
    size = (hub.repos[GGUFS].folder / Q4_1_FILE).stat().st_size
    assert bytes_sent(hub) == {f"/{GGUFS}/{Q4_1_FILE}": GGUF_HEAD_BYTES + size}   # its head, then all of it
    assert f"{GGUFS}:q4_1: downloaded {size} bytes in " in first.log()
    hub.clear()
    again = serve(tmp_path, "again", f"{GGUFS}:q4_1", env)
    try:
        assert chat(again) == (models, answer)
    finally:
        again.stop()
    assert hub.seen() == []


def run_cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pagedkube", *argv], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("model, extra, message", [
    (f"{ORG}/no-such-repo", {}, f"{ORG}/no-such-repo is neither a local path nor a model repo on "),
    (GATED, {}, f"{GATED} is a gated repo: accept its terms on the Hub, then set HF_TOKEN"),
    (CHAT, {"HF_ENDPOINT": "http://127.0.0.1:PORT"}, "cannot reach http://127.0.0.1:PORT to download "),
    (CHAT, {"HF_HUB_OFFLINE": "1"}, f"{CHAT} is not in the Hugging Face cache "),
    (GPT2, {}, f"{GPT2}: unsupported architecture ['GPT2LMHeadModel'] in config.json; supported: "),
    (HUGE, {}, f"{HUGE} needs 1000.0 TB but "),
    (f"{GGUFS}:Q5_K", {}, f"{GGUFS}:Q5_K: {GGUFS} has no GGUF file for Q5_K; name one of "
                          f"{Q4_1_FILE}, {Q8_0_FILE} as "),
    ("/no/such/model-dir", {}, "model '/no/such/model-dir' is not a model name "),   # a local path, too
    (GEMMA, {}, f"{GEMMA}: unsupported GGUF architecture 'gemma3'; supported: llama, qwen2"),
], ids=["unknown-repo", "gated-without-token", "no-network", "offline-cold-cache", "unsupported-architecture",
        "disk-full", "no-such-quant", "no-such-path", "unsupported-gguf-architecture"])
def test_a_model_that_cannot_be_had_is_one_line_and_exit_code_2(hub, tmp_path, model, extra, message) -> None:
    port = str(free_port())
    extra = {k: v.replace("PORT", port) for k, v in extra.items()}
    hub.clear()
    done = run_cli("serve", model, "--port", str(free_port()), env=hub_env(hub, tmp_path, **extra))
    out = done.stdout + done.stderr
    errors = [line for line in out.splitlines() if "error" in line.lower()]
    assert done.returncode == 2, out
    assert "Traceback" not in out
    assert errors == [line for line in errors if line.startswith("pagedkube serve: error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"pagedkube serve: error: {message.replace('PORT', port)}"), out
    # No weights fetched: at most a GGUF's head, read for its architecture.
    assert {p: n for p, n in hub.seen_bytes().items() if p.endswith(".safetensors") or n > GGUF_HEAD_BYTES} == {}


def test_a_token_opens_a_gated_repo_and_generate_takes_a_hub_name(hub, tmp_path) -> None:
    env = hub_env(hub, tmp_path, HF_TOKEN="hf_test_token")
    hub.clear()
    done = run_cli("generate", "--model", GATED, "--prompt", "Hello", "--max-tokens", "4", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), done.stdout
    assert downloads(hub) == sorted(f"/{GATED}/{name}" for name in ENGINE_FILES)
    assert f"{GATED}: downloaded " in done.stderr


def test_download_fetches_and_converts_once_and_reports_an_error_for_the_pod_status(hub, tmp_path) -> None:
    """`pagedkube download`, as the operator's init container runs it: the model's path on stdout
    (the GGUF converted into PAGEDKUBE_CACHE_DIR), and a failure's one line in --termination-log."""
    env = hub_env(hub, tmp_path)
    hub.clear()
    done = run_cli("download", f"{GGUFS}/{Q8_0_FILE}", env=env)
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.name == Q8_0_FILE and path.read_bytes() == (hub.repos[GGUFS].folder / Q8_0_FILE).read_bytes()
    assert downloads(hub) == [f"/{GGUFS}/{Q8_0_FILE}"]      # (its head first, for the architecture)
    assert len(list((tmp_path / "pagedkube" / "gguf").glob("*-v*/done.json"))) == 1
    hub.clear()
    again = run_cli("download", f"{GGUFS}/{Q8_0_FILE}", env=env)
    assert (again.returncode, again.stdout, hub.seen()) == (0, done.stdout, [])
    termination = tmp_path / "termination-log"
    failed = run_cli("download", GATED, "--termination-log", str(termination), env=env)
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines()[-1].startswith(f"pagedkube download: error: {GATED} is a gated repo")
    assert termination.read_text().startswith(f"{GATED} is a gated repo: accept its terms")


def test_a_snapshot_without_huggingface_hubs_file_listing_serves_offline(hub, tmp_path) -> None:
    """A cache made by an older huggingface_hub (no trees/<commit>.json): offline its files stand
    in for the listing; online it is checked once against the Hub, without downloading again."""
    env = hub_env(hub, tmp_path)
    first = run_cli("download", CHAT, env=env)
    assert first.returncode == 0, first.stderr
    (trees,) = (tmp_path / "hf" / "hub").glob("models--*tiny-chat/trees")
    shutil.rmtree(trees)
    hub.clear()
    offline = run_cli("download", CHAT, env={**env, "HF_HUB_OFFLINE": "1"})
    assert (offline.returncode, offline.stdout, hub.seen()) == (0, first.stdout, []), offline.stderr
    online = run_cli("download", CHAT, env=env)
    assert (online.returncode, online.stdout) == (0, first.stdout), online.stderr
    assert hub.seen() and not [p for p in downloads(hub) if p.endswith(".safetensors")]
    assert trees.is_dir()                                   # written again: the next start asks nothing
    hub.clear()
    assert run_cli("download", CHAT, env=env).returncode == 0 and hub.seen() == []


def test_revision_pins_the_commit_the_files_come_from(hub, tmp_path) -> None:
    """vLLM's --revision: `serve ORG/NAME --revision SHA` is `serve ORG/NAME@SHA`: the files are
    asked for at that commit, and a second start with the same pin asks the mirror nothing."""
    sha = hub.repos[CHAT].sha
    env = hub_env(hub, tmp_path)
    hub.clear()
    first = ServerProcess(tmp_path, "--model", CHAT, "--revision", sha, "--max-model-len", "256", name="pinned",
                          env=env).start()
    try:
        assert chat(first)[0] == [CHAT]
    finally:
        first.stop()
    asked = [p for m, p in hub.seen() if m == "GET" and "/resolve/" in p]
    assert asked and all(f"/resolve/{sha}/" in p for p in asked), asked
    hub.clear()
    again = ServerProcess(tmp_path, "--model", f"{CHAT}@{sha}", "--max-model-len", "256", name="pinned-again",
                          env=env).start()
    again.stop()
    assert hub.seen() == []
