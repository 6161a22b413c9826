"""`cluster.sh down` leaves nothing of the real node behind: no process, mount,
network namespace, veth, bridge, iptables rule or cgroup (this file runs last;
the session's own `down` afterwards finds nothing to do)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from kubeutil import Kube
from nodeutil import CLUSTER, node_env, state_dir


def leftovers(state: str) -> dict[str, list[str]]:
    def lines(*cmd: str) -> list[str]:
        p = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return p.stdout.splitlines()
    iptables = [r for cmd in ("iptables", "ip6tables") for t in ("filter", "nat", "mangle") for r in lines(cmd, "-t", t, "-S")
                if re.search(r"KUBE-|CNI-|pagedkube", r)]
    return {
        "processes": [line for line in lines("ps", "-eo", "pid,args")
                      if state in line or re.search(r"\b(kubelet|kube-proxy|containerd)\b", line)],
        "mounts": [line for line in Path("/proc/self/mounts").read_text().splitlines()
                   if state in line or "/pagedkube/node/containerd" in line],
        "netns": [n for n in (os.listdir("/var/run/netns") if os.path.isdir("/var/run/netns") else [])
                  if n.startswith("cni-")],
        "links": [line for line in lines("ip", "-o", "link") if re.search(r"\bveth|pagedkube0", line)],
        "iptables": iptables,
        "cgroups": [str(p) for p in Path("/sys/fs/cgroup").glob("*/pagedkube-e2e")],
        "state": [state] if os.path.exists(state) else [],
    }


def test_down_leaves_nothing_behind(kube: Kube) -> None:
    if os.environ.get("PAGEDKUBE_E2E_KUBECONFIG"):
        pytest.skip("a cluster given by PAGEDKUBE_E2E_KUBECONFIG is not ours to stop")
    env = node_env()
    state = str(state_dir())
    p = subprocess.run([str(CLUSTER / "cluster.sh"), "down"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert leftovers(state) == {k: [] for k in leftovers(state)}
