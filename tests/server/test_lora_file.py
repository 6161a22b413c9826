"""--lora-modules-file (what the LLMService operator's spec.adapters becomes): a real `pagedkube
serve` process serves the adapters a file lists, one of them a Hub repo fetched from a local Hub
mirror, leaves out one that cannot load, and follows the file while it runs: an adapter it drops
is a 404 and one it adds answers, with no restart."""
from __future__ import annotations

import json
import time

import openai
import pytest

from hfhub import HubRepo, HubServer
from lora_adapters import trained_adapters
from model_factory import BUILTIN_TINY
from pagedkube.builtin import builtin_model_dir
from pagedkube.engine.lora.modules import LoRAModule
from pagedkube.engine.server.lora_file import read_lora_modules_file

from .conftest import ServerProcess
from .test_hub_models import CHAT, downloads, hub_env, run_cli

BASE = "tiny-base"
DOGS_REPO = "pagedkube-test/dogs-lora"
PROMPT = "My dog limps after a walk."


@pytest.fixture(scope="module")
def adapters():
    return trained_adapters("tiny", builtin_model_dir())


@pytest.fixture(scope="module")
def hub(adapters):
    server = HubServer([HubRepo.of(DOGS_REPO, adapters["dogs"]), HubRepo.of(CHAT, BUILTIN_TINY)]).start()
    yield server
    server.close()


def write(path, modules: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")            # replaced whole, as the kubelet swaps a ConfigMap's files
    tmp.write_text(json.dumps(modules))
    tmp.replace(path)


def models(client: openai.OpenAI) -> list[str]:
    return [m.id for m in client.models.list().data]


def answer(client: openai.OpenAI, model: str) -> str:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.model == model and r.usage.completion_tokens == 8
    return r.choices[0].text


def until_models(client: openai.OpenAI, expected: list[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while models(client) != expected:
        assert time.monotonic() < deadline, f"models {models(client)}, waiting for {expected}"
        time.sleep(0.5)


def test_the_server_follows_its_modules_file(tmp_path, adapters, hub):
    modules = tmp_path / "lora-modules.json"
    write(modules, [{"name": "dogs", "path": DOGS_REPO}, {"name": "cats", "path": str(adapters["cats"])},
                    {"name": "broken", "path": str(tmp_path / "no-such-adapter")}])
    server = ServerProcess(tmp_path, "--served-model-name", BASE, "--max-model-len", "512", "--enable-lora",
                           "--max-loras", "2", "--max-lora-rank", "16", "--lora-modules-file", str(modules),
                           name="lora-file", env=hub_env(hub, tmp_path)).start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        # The Hub adapter came from the mirror (its two PEFT files only); the broken one is left out.
        assert models(client) == [BASE, "dogs", "cats"]
        assert downloads(hub) == [f"/{DOGS_REPO}/adapter_config.json", f"/{DOGS_REPO}/adapter_model.safetensors"]
        assert client.models.retrieve("dogs").root == DOGS_REPO
        assert "LoRA adapter broken from" in server.log() and "not loaded" in server.log()
        base, dogs, cats = answer(client, BASE), answer(client, "dogs"), answer(client, "cats")
        assert dogs != base and cats != base

        # The file drops cats and the broken one, and adds diet and the dogs adapter's local folder.
        write(modules, [{"name": "dogs", "path": DOGS_REPO}, {"name": "diet", "path": str(adapters["diet"])},
                        {"name": "dogs-local", "path": str(adapters["dogs"])}])
        until_models(client, [BASE, "dogs", "diet", "dogs-local"])
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            answer(client, "cats")
        assert answer(client, "dogs-local") == dogs      # the Hub's copy is the same adapter
        assert answer(client, "diet") != base
        assert answer(client, BASE) == base
        assert server.proc is not None and server.proc.poll() is None
    finally:
        server.stop()


def test_download_fetches_the_files_hub_adapters_too(tmp_path, adapters, hub):
    """The operator's init container: `pagedkube download MODEL --lora-modules-file F` puts the
    Hub adapters into the cache beside the model; one the Hub lacks is a warning, not a failure."""
    modules = tmp_path / "lora-modules.json"
    write(modules, [{"name": "dogs", "path": f"hf://{DOGS_REPO}"}, {"name": "gone", "path": "pagedkube-test/gone"},
                    {"name": "cats", "path": str(adapters["cats"])}])
    env = hub_env(hub, tmp_path)
    hub.clear()
    done = run_cli("download", CHAT, "--lora-modules-file", str(modules), env=env)
    assert done.returncode == 0, done.stderr
    assert "warning: LoRA adapter gone: pagedkube-test/gone is neither a local path nor a model repo" in done.stderr
    assert [p for p in downloads(hub) if "lora" in p] == [f"/{DOGS_REPO}/adapter_config.json",
                                                          f"/{DOGS_REPO}/adapter_model.safetensors"]
    hub.clear()
    again = run_cli("download", CHAT, "--lora-modules-file", str(modules), env={**env, "HF_HUB_OFFLINE": "1"})
    assert again.returncode == 0 and hub.seen() == [], again.stderr       # both from the cache, offline
    assert f"LoRA adapter dogs: hf://{DOGS_REPO} -> " in again.stderr


@pytest.mark.parametrize("text, message", [
    ("[{\"name\": \"dogs\"", "not valid JSON"),
    ("{\"name\": \"dogs\", \"path\": \"/a\"}", "expected a JSON list of"),
    ("[{\"name\": \"dogs\", \"path\": \"/a\", \"rank\": 8}]", "expected a JSON list of"),
    ("[{\"name\": \"dogs\", \"path\": \"/a\"}, {\"name\": \"dogs\", \"path\": \"/b\"}]", "names an adapter twice"),
    ("[{\"name\": \"-dogs\", \"path\": \"/a\"}]", "LoRA adapter name '-dogs'"),
    ("[{\"name\": \"dogs\", \"path\": \"\"}]", "path must be a non-empty string"),
])
def test_a_bad_modules_file_is_a_clear_error(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "lora-modules.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_lora_modules_file(path)


def test_a_modules_file_reads_as_lora_modules(tmp_path) -> None:
    path = tmp_path / "lora-modules.json"
    write(path, [{"name": "dogs", "path": DOGS_REPO}, {"name": "cats", "path": "/a", "base_model_name": BASE}])
    assert read_lora_modules_file(path) == (LoRAModule("dogs", DOGS_REPO), LoRAModule("cats", "/a", BASE))
    write(path, [])
    assert read_lora_modules_file(path) == ()
