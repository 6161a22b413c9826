"""vLLM's flag names where the concept is ours too (docs/server.md "Flags, as vLLM names them"):
--gpu-memory-utilization, --enable-prefix-caching / --no-enable-prefix-caching, --tokenizer,
--chat-template and --generation-config, checked on a real server process."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from pagedkube.builtin import builtin_model_dir
from pagedkube.cli import build_parser
from pagedkube.engine.server.serve_cli import build_config
from pagedkube.tokenizer import Tokenizer

from .conftest import ServerProcess, free_port

# A template no model ships: the prompt's token count tells which template rendered it.
TEMPLATE = ("{% for m in messages %}[{{ m.role | upper }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[ASSISTANT] {% endif %}")
MESSAGES = [{"role": "system", "content": "You answer questions about dogs."},
            {"role": "user", "content": "How often should a beagle be walked? " * 6}]


def parse(*argv: str):
    return build_config(build_parser().parse_args(["serve", *argv]))


def test_vllm_flag_names_reach_the_configs(tmp_path) -> None:
    config = parse("--gpu-memory-utilization", "0.5", "--no-enable-prefix-caching", "--tokenizer", "/tok",
                   "--chat-template", TEMPLATE, "--generation-config", "vllm")
    engine = config.engine
    assert (engine.gpu_memory_utilization, engine.enable_prefix_caching, engine.tokenizer, engine.chat_template) == \
        (0.5, False, "/tok", TEMPLATE)
    assert config.generation_config == "vllm"
    defaults = parse()
    assert (defaults.engine.gpu_memory_utilization, defaults.engine.enable_prefix_caching,
            defaults.generation_config) == (None, True, "auto")
    assert parse("--enable-prefix-caching").engine.enable_prefix_caching is True


def test_revision_pins_a_hub_model() -> None:
    assert parse("org/model", "--revision", "v1.0").engine.model == "org/model@v1.0"
    assert parse("--model", "org/model:Q4_K_M", "--revision", "abc123").engine.model == "org/model:Q4_K_M@abc123"
    assert parse("org/model@v1.0", "--revision", "v1.0").engine.model == "org/model@v1.0"
    with pytest.raises(ValueError, match="two revisions: 'org/model@v1.0' and --revision 'v2'"):
        parse("org/model@v1.0", "--revision", "v2")
    with pytest.raises(ValueError, match="--revision 'v1' applies to Hugging Face Hub models; 'builtin://tiny'"):
        parse("builtin://tiny", "--revision", "v1")


def test_up_passes_the_switch_both_ways() -> None:
    from pagedkube.gateway.local.cli import engine_args
    assert engine_args(build_parser().parse_args(["up", "--no-enable-prefix-caching"])) == \
        ["--no-enable-prefix-caching"]
    assert engine_args(build_parser().parse_args(["up", "--enable-prefix-caching", "--gpu-memory-utilization",
                                                  "0.25"])) == ["--gpu-memory-utilization", "0.25",
                                                                "--enable-prefix-caching"]


@pytest.mark.parametrize("argv, message", [
    (["--gpu-memory-utilization", "1.5"], "expected a fraction in (0, 1] like 0.9, got '1.5'"),
    (["--gpu-memory-utilization", "most"], "expected a fraction in (0, 1] like 0.9, got 'most'"),
    (["--gpu-memory-utilization", "0.5", "--kv-cache-memory", "1GiB"], "not allowed with argument"),
])
def test_bad_memory_flags_are_usage_errors(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: pagedkube serve") and message in err


@pytest.mark.parametrize("flag, value, message", [
    ("--chat-template", "templates/missing.jinja", "is neither a readable file nor a Jinja template"),
    ("--generation-config", "/nonexistent-folder", "cannot read /nonexistent-folder/generation_config.json"),
])
def test_a_missing_file_ends_serve_in_one_line_before_the_model_loads(flag, value, message) -> None:
    done = subprocess.run([sys.executable, "-m", "pagedkube", "serve", "--model", "builtin://tiny",
                           "--port", str(free_port()), flag, value], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagedkube serve: error: ") and message in lines[0], lines


def test_gpu_memory_utilization_sizes_the_cpu_pool_from_available_memory() -> None:
    from pagedkube.engine.config import EngineConfig
    from pagedkube.engine.host_memory import available_host_memory
    from pagedkube.engine.model_runner import ModelRunner

    runner = ModelRunner(EngineConfig(model="builtin://tiny", device="cpu", gpu_memory_utilization=0.002))
    bytes_per_block = runner.model_config.kv_bytes_per_block(runner.block_size, runner.kv_dtype.itemsize)
    expected = 0.002 * available_host_memory() / bytes_per_block
    assert abs(runner.num_kv_blocks - expected) < 0.05 * expected   # available memory drifts a little


@pytest.fixture(scope="module")
def flagged(tmp_path_factory):
    """A server with its template from a file, no prefix caching, and request defaults from a
    generation config folder (greedy, 5 new tokens)."""
    tmp = tmp_path_factory.mktemp("vllm-flags")
    (tmp / "template.jinja").write_text(TEMPLATE)
    gen = tmp / "gen"
    gen.mkdir()
    (gen / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": 5,
                                                            "top_p": 7}))   # out of range: left out
    proc = ServerProcess(tmp, "--model", "builtin://tiny", "--chat-template", str(tmp / "template.jinja"),
                         "--no-enable-prefix-caching", "--generation-config", str(gen), name="vllm-flags").start()
    yield proc
    proc.stop()


def chat(server: ServerProcess, **fields) -> dict:
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": MESSAGES, **fields}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_chat_template_flag_renders_every_prompt(flagged) -> None:
    tokenizer = Tokenizer.from_pretrained(builtin_model_dir("tiny"))
    ours = "".join(f"[{m['role'].upper()}] {m['content']}\n" for m in MESSAGES) + "[ASSISTANT] "
    assert tokenizer.render_chat(MESSAGES) != ours     # the model's own template differs
    assert chat(flagged)["usage"]["prompt_tokens"] == len(tokenizer.encode(ours, add_special_tokens=False))
    served = httpx.get(f"{flagged.url}/v1/cache/tokenizer", timeout=10).json()["files"]
    assert Tokenizer(served).chat_template == TEMPLATE   # what the gateway renders with


def test_generation_config_fills_what_the_request_leaves_out(flagged) -> None:
    omitted = chat(flagged, ignore_eos=True)
    assert omitted["usage"]["completion_tokens"] == 5     # max_new_tokens
    greedy = chat(flagged, ignore_eos=True, temperature=0, max_tokens=5)
    assert omitted["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]
    sampled = [chat(flagged, ignore_eos=True, temperature=1.0, max_tokens=12, seed=s) for s in (1, 2)]
    assert sampled[0]["usage"]["completion_tokens"] == 12                  # the request's own fields win
    assert sampled[0]["choices"][0]["message"]["content"] != sampled[1]["choices"][0]["message"]["content"]


def cached_tokens(server: ServerProcess) -> int:
    usage = chat(server, max_tokens=1)["usage"]
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_no_enable_prefix_caching_never_hits(flagged, server) -> None:
    assert [cached_tokens(flagged) for _ in range(2)] == [0, 0]
    cached_tokens(server)
    assert cached_tokens(server) > 0      # the same repeat on a server with the default
