"""`pagedkube up --replicas 1` supervises its engine like a process manager (issue 14,
item 2), with real processes and the built-in model:

* the engine port wants this run's random key: a direct request without it gets 401; the
  key and the run's random cache hash seed are in the engine's environment, not its argv;
* SIGKILL the engine server: it leaves the gateway's endpoints, a new engine starts on a
  new port after the back-off, turns ready, and a request through the gateway succeeds;
* SIGKILL the engine's core child: the server exits 1 and again a new engine serves;
* SIGSTOP that one (wedged: holds its port, never answers): its /health fails 3 times, the
  supervisor kills it and, after a doubled back-off, a third engine serves.

Back-off arithmetic and state transitions are in test_restart_policy.py (no processes).
"""
from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx
import pytest
from up_process import START_TIMEOUT_S, Up, alive, assert_stopped_cleanly, children

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FLAGS = ("--replicas", "1", "--num-kv-blocks", "64", "--max-model-len", "256")
# The health check needs up to 3 periods of 5 s plus their timeouts to give up on a
# wedged engine; then a 1 s back-off and a fresh start.
RESTART_TIMEOUT_S = START_TIMEOUT_S + 60


def server_pids(up: Up) -> list[int]:
    return [int(p) for p in re.findall(r"^engine-0 \| INFO: +Started server process \[(\d+)\]", up.text(), re.M)]


def completion(up: Up) -> httpx.Response:
    return httpx.post(f"{up.url}/v1/completions", timeout=120,
                      json={"model": "tiny", "prompt": "My cat likes", "max_tokens": 4, "ignore_eos": True})


def wait_ready(up: Up, restarts: int) -> str:
    """Waits for engine-0's ready line after `restarts` restarts; returns its URL."""
    suffix = "" if restarts == 0 else rf", restarts {restarts}"
    pattern = rf"^status +\| engine-0 +ready +(http://\S+) +\(loaded in [\d.]+ s{suffix}\)$"
    found = up.wait_for(lambda: re.findall(pattern, up.text(), re.M), RESTART_TIMEOUT_S,
                        f"engine-0 ready after {restarts} restarts")
    up.wait_for(lambda: httpx.get(f"{up.url}/ready", timeout=5).status_code == 200, 30, "the gateway ready")
    return found[-1]


def test_engine_is_keyed_and_a_sigkilled_engine_is_replaced(tmp_path):
    up = Up(tmp_path, *FLAGS)
    try:
        first_url = wait_ready(up, 0)
        # The engine wants this run's key; only the gateway has it.
        for headers in ({}, {"Authorization": "Bearer guessed"}):
            r = httpx.post(f"{first_url}/v1/completions", headers=headers, timeout=30,
                           json={"model": "tiny", "prompt": "My cat likes", "max_tokens": 1})
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{first_url}/health", timeout=30).status_code == 200   # probes stay open
        # The key and the hash seed are in the engine's environment, not on its command line.
        (first_pid,) = server_pids(up)
        env = dict(line.split("=", 1) for line in
                   Path(f"/proc/{first_pid}/environ").read_bytes().decode().split("\0") if "=" in line)
        key, seed = env["PAGEDKUBE_API_KEY"], env["PAGEDKUBE_HASH_SEED"]
        assert len(key) >= 43 and len(seed) >= 43 and key != seed
        cmdline = Path(f"/proc/{first_pid}/cmdline").read_bytes().decode()
        assert key not in cmdline and seed not in cmdline
        r = httpx.get(f"{first_url}/v1/cache/config", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert r.status_code == 200 and r.json()["hash_seed"] == seed
        assert completion(up).status_code == 200

        os.kill(first_pid, signal.SIGKILL)
        up.wait_for(lambda: re.search(r"^engine-0 \| exited with code -9; restarting in 1 s$", up.text(), re.M),
                    60, "the exit noticed")
        assert re.search(r"^status +\| engine-0 +restarting +http://\S+ +\(exited with code -9; next start "
                         r"in \d+ s\)$", up.text(), re.M)
        new_url = wait_ready(up, 1)
        assert new_url != first_url
        r = completion(up)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert len(server_pids(up)) == 2
    finally:
        pids = server_pids(up)
        assert_stopped_cleanly(up, 1)
        assert not [p for p in pids if alive(p)]


def test_a_dead_core_and_then_a_wedged_engine_are_each_replaced(tmp_path):
    up = Up(tmp_path, *FLAGS)
    try:
        wait_ready(up, 0)
        (server,) = server_pids(up)
        (core,) = [pid for pid, cmd in children(server) if "spawn_main" in cmd]
        os.kill(core, signal.SIGKILL)
        # The server notices its core is gone and exits 1; the supervisor starts another.
        up.wait_for(lambda: re.search(r"^engine-0 \| exited with code 1; restarting in 1 s$", up.text(), re.M),
                    RESTART_TIMEOUT_S, "the server's exit after its core's death")
        wait_ready(up, 1)
        assert completion(up).status_code == 200
        assert not alive(server)

        # A wedged engine (stopped: it holds its port but never answers) fails its health
        # checks and is killed; the back-off has doubled (it was not ready for 60 s).
        second = server_pids(up)[-1]
        os.kill(second, signal.SIGSTOP)
        up.wait_for(lambda: re.search(r"^engine-0 \| /health failed 3 times in a row \(no answer\): killed; "
                                      r"restarting in 2 s$", up.text(), re.M),
                    RESTART_TIMEOUT_S, "the wedged engine killed")
        wait_ready(up, 2)
        r = completion(up)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert not alive(second)
    finally:
        pids = server_pids(up)
        assert_stopped_cleanly(up, 1)
        assert not [p for p in pids if alive(p)]


def test_an_engine_that_never_gets_ready_stops_up_with_exit_1(tmp_path):
    """A model whose weights file is corrupt: every start crashes before ready. After
    RestartPolicy.give_up_after such starts, with no engine of the run ever ready, `up`
    says so and exits 1 (instead of restarting for ever), leaving no engine behind."""
    import shutil

    from pagedkube.builtin import builtin_model_dir
    model = tmp_path / "corrupt"
    shutil.copytree(builtin_model_dir("tiny"), model)
    (model / "model.safetensors").write_bytes(b"\xff" * 100)
    up = Up(tmp_path, "--replicas", "1", model=str(model))
    try:
        code = up.proc.wait(RESTART_TIMEOUT_S + 60)
    finally:
        pids = up.engine_pids()
        up.stop()
    text = up.text()
    assert code == 1, text[-3000:]
    assert "SafetensorError" in text, text[-3000:]   # the engine's own error is shown
    assert re.search(r"^up +\| engine-0 ended 3 times without getting ready \(last: exited with code 1\)"
                     r" and no engine of this run has served: giving up", text, re.M), text[-3000:]
    assert len(re.findall(r"^engine-0 \| INFO: +Started server process", text, re.M)) <= 3
    assert "all stopped" in text
    assert not [pid for pid in pids.values() if alive(pid)], f"orphan engines: {pids}"


def test_an_engine_that_refuses_its_model_stops_up_at_once_with_exit_2(tmp_path):
    """A file that is no GGUF: the engine says so in one line and exits 2 (a user's mistake,
    which another start would repeat), so `up` stops after that one start, with exit 2."""
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(60))
    up = Up(tmp_path, "--replicas", "1", model=str(bad))
    try:
        code = up.proc.wait(RESTART_TIMEOUT_S)
    finally:
        pids = up.engine_pids()
        up.stop()
    text = up.text()
    assert code == 2, text[-3000:]
    assert re.search(r"^engine-0 \| pagedkube serve: error: cannot read GGUF file '.*broken\.gguf'", text, re.M)
    assert re.search(r"^up +\| engine-0 refused its configuration \(exited with code 2\): giving up", text, re.M)
    assert len(re.findall(r"^engine-0 \| INFO: +Started server process", text, re.M)) == 1
    assert "Traceback" not in text and "all stopped" in text
    assert not [pid for pid in pids.values() if alive(pid)], f"orphan engines: {pids}"
