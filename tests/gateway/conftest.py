"""Shared fixtures for the gateway tests."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = ["You are a helpful pet-care assistant.", "My dog Rex is a 3 year old beagle who loves walks.",
          "How often should I feed my puppy?", "Cats sleep a lot; that is normal."] * 4


def tokenizer_files() -> dict[str, str]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    config = {"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>", "bos_token": None}
    return {"tokenizer.json": tok.to_str(), "tokenizer_config.json": json.dumps(config)}


@pytest.fixture(scope="session")
def small_tokenizer_files() -> dict[str, str]:
    return tokenizer_files()


# -- real processes: engines (`pagedkube serve`) and gateways (`pagedkube gateway`) --------


REPO = Path(__file__).resolve().parents[2]
PAGEDKUBE = [sys.executable, "-m", "pagedkube"]
START_TIMEOUT_S = 180  # four engines importing torch on a shared 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    url: str
    popen: subprocess.Popen
    log: Path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=15)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class Processes:
    """Starts engines and gateways as subprocesses on free ports; stop_all() leaves no orphans."""
    tmp: Path
    procs: list[Proc] = field(default_factory=list)

    def _spawn(self, name: str, args: list[str], port: int, program: list[str] = PAGEDKUBE) -> Proc:
        log = self.tmp / f"{name}-{port}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
        with open(log, "wb") as out:
            popen = subprocess.Popen(program + args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        proc = Proc(name, f"http://127.0.0.1:{port}", popen, log)
        self.procs.append(proc)
        return proc

    def engine(self, *extra: str, port: int | None = None) -> Proc:
        port = port or free_port()
        model = [] if "--model" in extra else ["--model", "builtin://tiny"]   # the fast toy, not the default
        return self._spawn("engine", ["serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                                      *model, *extra], port)

    def gateway(self, endpoints: list[str], *extra: str, route_headers: bool = True) -> Proc:
        """A gateway; with `route_headers` (the tests read which engine answered) unless told otherwise."""
        port = free_port()
        return self._spawn("gateway", ["gateway", "--endpoints", ",".join(endpoints), "--host", "127.0.0.1",
                                       "--port", str(port), "--scrape-interval", "0.2", "--feed-interval", "0.1",
                                       *(["--route-headers"] if route_headers else []), *extra], port)

    def vllm_router(self, endpoints: list[str], *extra: str) -> Proc:
        """vLLM's router (`vllm-router` from PyPI) in front of `endpoints`."""
        port = free_port()
        return self._spawn("vllm-router", ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *endpoints,
                                           *extra], port, program=[sys.executable, "-m", "vllm_router.launch_router"])

    def wait_ready(self, *procs: Proc, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        for proc in procs:
            while True:
                if proc.popen.poll() is not None:
                    raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
                try:
                    if httpx.get(proc.url + "/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{proc.name} {proc.url} not ready after {timeout} s:\n{proc.log_tail()}")
                time.sleep(0.2)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp("procs"))
    try:
        yield procs
    finally:
        procs.stop_all()


BUILTIN_TINY = REPO / "pagedkube" / "builtin" / "tiny"
MODEL_NAME = "tiny"


@pytest.fixture(scope="session")
def engine_model_args(tmp_path_factory, small_tokenizer_files) -> list[str]:
    """`pagedkube serve` model flags: the built-in model; until it is committed,
    a random tiny Qwen2 from tests/helpers/model_factory.py with the small tokenizer."""
    if (BUILTIN_TINY / "model.safetensors").is_file():
        return ["--served-model-name", MODEL_NAME]
    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    from model_factory import make_tiny_model

    path = tmp_path_factory.mktemp("model") / "qwen2"
    make_tiny_model("qwen2", path)
    for name, text in small_tokenizer_files.items():
        (path / name).write_text(text)
    return ["--model", str(path), "--served-model-name", MODEL_NAME]


def _wait_until(predicate, timeout: float = 60.0, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s")
        time.sleep(interval)


def _metric(url: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` with these labels in a /metrics page (0.0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


@pytest.fixture(scope="session")
def wait_until():
    """wait_until(predicate, timeout=60): polls; fails the test after the timeout."""
    return _wait_until


@pytest.fixture(scope="session")
def metric():
    """metric(url, name, **labels): a sample (summed over matching label sets) of url/metrics."""
    return _metric
