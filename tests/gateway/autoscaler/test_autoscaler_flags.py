"""Autoscaler flags of `pagedkube gateway` (as the operator passes them) and `pagedkube up`."""
from __future__ import annotations

import pytest

from pagedkube.cli import build_parser, main
from pagedkube.gateway.cli import config_from_args
from pagedkube.gateway.local.cli import engine_args


def gateway_config(*argv: str):
    return config_from_args(build_parser().parse_args(["gateway", *argv]))


def test_operator_flags_give_the_autoscaler_config_and_hold_for_scale_from_zero():
    # exactly the args operator/builders/gateway.py builds
    config = gateway_config("--kube-service", "chat-engine", "--namespace", "team-a", "--autoscale",
                            "--llmservice", "chat", "--min-replicas", "0", "--max-replicas", "8",
                            "--target-queue-depth", "4", "--scale-up-window", "0", "--scale-down-window", "300")
    a = config.autoscale
    assert (a.llmservice, a.min_replicas, a.max_replicas, a.target_queue_depth) == ("chat", 0, 8, 4.0)
    assert (a.scale_up_window, a.scale_down_window, a.interval, a.max_held) == (0.0, 300.0, 5.0, 256)
    assert config.hold_timeout == 120.0
    assert gateway_config("--kube-service", "chat-engine").hold_timeout == 0.0   # no autoscaler: 503 at once
    assert gateway_config("--kube-service", "e", "--hold-timeout", "3").hold_timeout == 3.0


@pytest.mark.parametrize("argv,message", [
    (["--endpoints", "http://127.0.0.1:1", "--autoscale"], "--autoscale needs --kube-service"),
    (["--kube-service", "e", "--autoscale"], "--llmservice"),
    (["--kube-service", "e", "--autoscale", "--llmservice", "x", "--min-replicas", "3", "--max-replicas", "2"],
     "--max-replicas"),
    (["--kube-service", "e", "--autoscale", "--llmservice", "x", "--target-queue-depth", "0"], "--target-queue-depth"),
])
def test_bad_autoscale_flags_are_clear_errors(argv, message, capsys):
    assert main(["gateway", *argv]) == 2
    assert message in capsys.readouterr().err


def test_up_passes_engine_options_through_and_rejects_bad_ones(capsys):
    args = build_parser().parse_args(["up", "--max-num-seqs", "4", "--num-kv-blocks", "64", "--autoscale"])
    assert engine_args(args) == ["--num-kv-blocks", "64", "--max-num-seqs", "4"]
    assert main(["up", "--replicas", "0"]) == 2
    assert "--replicas 0 needs --autoscale" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["up", "--kv-cache-memory", "lots"])
    assert "not a size in bytes" in capsys.readouterr().err
