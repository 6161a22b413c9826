"""`pagedkube gateway --help` and `pagedkube serve --help` keep the knobs a deployment sets
apart from the tuning knobs (measured defaults, for benchmarks), as their docs do."""
from __future__ import annotations

import argparse

from pagedkube.cli import build_parser

GATEWAY_TUNING = {"--load-floor", "--affinity-depth", "--pending-ttl", "--ring-key-blocks", "--tokenize-workers",
                  "--max-attempts", "--upstream-timeout", "--connect-timeout", "--eject-after-failures",
                  "--eject-seconds", "--feed-interval", "--feed-wait", "--scrape-interval"}
SERVE_TUNING = {"--max-body-bytes", "--body-read-timeout", "--heartbeat-timeout", "--engine-in-process", "--loop"}


def groups(command: str) -> dict[str, set[str]]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[command]
    return {g.title: {o for a in g._group_actions for o in a.option_strings if o.startswith("--")}
            for g in parser._action_groups}


def test_gateway_tuning_knobs_sit_in_their_own_group() -> None:
    g = groups("gateway")
    assert g["tuning"] == GATEWAY_TUNING
    assert g["routing"] == {"--routing", "--load-bound", "--route-headers"}


def test_gateway_tuning_knobs_are_the_docs_tuning_table() -> None:
    from pathlib import Path
    page = (Path(__file__).resolve().parents[2] / "docs" / "gateway.md").read_text()
    tuning = page.split("### Tuning knobs", 1)[1].split("\n## ", 1)[0]
    documented = {word.strip().strip("`").split()[0] for row in tuning.splitlines() if row.startswith("| `")
                  for word in row.split("|")[1].split(",")}
    assert documented == GATEWAY_TUNING


def test_serve_groups_engine_server_and_tuning() -> None:
    g = groups("serve")
    assert g["tuning (the defaults suit most deployments)"] == SERVE_TUNING
    assert {"--model", "--block-size", "--max-num-seqs", "--kv-cache-memory"} <= g["model and engine"]
