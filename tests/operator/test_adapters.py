"""spec.adapters: the parser and the CRD agree on what is valid, and the builders keep the engine
pod template the same whatever the list holds (an edit reaches engines through the ConfigMap)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from pagedkube.operator import naming
from pagedkube.operator.adapters import MAX_ADAPTERS, AdapterSpec
from pagedkube.operator.builders import build_children
from pagedkube.operator.builders.adapters import MODULES_FILE, build_adapters_config_map, claim_volume_name
from pagedkube.operator.builders.engine import build_engine_deployment
from pagedkube.operator.spec import LLMServiceSpec

sys.path.insert(0, str(Path(__file__).parent))
from llms_crd_check import validate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "manifests/crd.yaml").read_text())
VET = {"name": "vet-notes", "source": "hf://clinic/vet-notes-lora"}
CATS = {"name": "cat-care", "source": "pvc://adapters/cat-care/v2"}
DIET = {"name": "diet", "source": "clinic/diet-lora@v1.0"}


def body(adapters: list | None = None, model: str = "clinic/base-model", **spec: object) -> dict:
    out = {"apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService",
           "metadata": {"name": "pets", "namespace": "team-a", "uid": "u-1"},
           "spec": {"model": {"source": model}, **spec}}
    if adapters is not None:
        out["spec"]["adapters"] = adapters
    return out


def parse(b: dict) -> LLMServiceSpec:
    return LLMServiceSpec.from_body(b)


def test_adapters_parse_into_engine_paths() -> None:
    svc = parse(body([VET, CATS, DIET]))
    assert svc.adapters == (
        AdapterSpec("vet-notes", VET["source"], hub_name="clinic/vet-notes-lora"),
        AdapterSpec("cat-care", CATS["source"], claim="adapters", path="cat-care/v2"),
        AdapterSpec("diet", DIET["source"], hub_name="clinic/diet-lora@v1.0"),
    )
    assert [a.engine_path for a in svc.adapters] == [
        "clinic/vet-notes-lora", "/adapters/adapters/cat-care/v2", "clinic/diet-lora@v1.0"]
    assert svc.lora_enabled and svc.max_loras == 8 and svc.engine.max_lora_rank == 64
    assert not parse(body()).lora_enabled and not parse(body([])).lora_enabled
    only_slots = parse(body(engine={"maxLoras": 2, "maxLoraRank": 16}))
    assert only_slots.lora_enabled and only_slots.max_loras == 2 and only_slots.engine.max_lora_rank == 16


BAD = [
    ("repeated name", [VET, {**CATS, "name": "vet-notes"}], "spec.adapters names 'vet-notes' twice",
     ".spec.adapters[1]: Duplicate value: {'name': 'vet-notes'}"),
    ("upper-case name", [{**VET, "name": "Vet"}], "spec.adapters[0].name 'Vet' must be a DNS label",
     "spec.adapters.0.name: 'Vet' does not match"),
    ("name too long", [{**VET, "name": "a" * 64}], "spec.adapters[0].name 'aaaa",
     "spec.adapters.0.name: 'aaaa"),
    ("a GGUF is no adapter", [{**VET, "source": "clinic/vet:Q4_K_M"}], "spec.adapters[0].source 'clinic/vet:Q4_K_M'",
     "spec.adapters.0.source: 'clinic/vet:Q4_K_M' does not match"),
    ("builtin source", [{**VET, "source": "builtin://tiny"}], "spec.adapters[0].source 'builtin://tiny'",
     "spec.adapters.0.source: 'builtin://tiny' does not match"),
    ("pvc climbing out", [{**CATS, "source": "pvc://adapters/../../etc"}], "spec.adapters[0].source",
     ".spec.adapters[0]: adapter source must not have a '..' segment"),
    ("no source", [{"name": "x"}], "spec.adapters[0].source None", "spec.adapters.0: 'source' is a required property"),
    ("unknown field", [{**VET, "rank": 8}], "spec.adapters[0] must be an object with name and source",
     "spec.adapters.0: Additional properties are not allowed ('rank' was unexpected)"),
    ("too many", [{"name": f"a{i}", "source": f"org/a{i}"} for i in range(MAX_ADAPTERS + 1)],
     f"spec.adapters lists {MAX_ADAPTERS + 1} adapters; at most {MAX_ADAPTERS}", "spec.adapters: [{"),
]


@pytest.mark.parametrize("case, adapters, parse_error, crd_error", BAD, ids=[c[0] for c in BAD])
def test_bad_adapters_are_refused_by_the_crd_and_the_operator(case: str, adapters: list, parse_error: str,
                                                              crd_error: str) -> None:
    with pytest.raises(ValueError) as e:
        parse(body(adapters))
    assert str(e.value).startswith(parse_error), str(e.value)
    errors = validate(CRD, body(adapters))
    assert len(errors) == 1 and errors[0].startswith(crd_error), errors


def test_the_served_model_name_and_the_vllm_runtime_are_refused() -> None:
    with pytest.raises(ValueError, match="'base' is the served model's name"):
        parse(body([{**VET, "name": "base"}], model="clinic/base"))
    vllm = body([VET], engine={"runtime": "vllm"})
    with pytest.raises(ValueError, match="spec.adapters needs the pagedkube runtime"):
        parse(vllm)
    assert validate(CRD, vllm) == [".spec: spec.adapters needs the pagedkube runtime"]
    assert validate(CRD, body([VET, CATS, DIET], engine={"maxLoras": 4, "maxLoraRank": 16})) == []


@pytest.mark.parametrize("engine, ranks", [({"tensorParallelSize": 2}, 2), ({"nodesPerReplica": 2}, 2),
                                           ({"tensorParallelSize": 2, "nodesPerReplica": 2}, 4)])
def test_adapters_on_a_sharded_engine_are_refused(engine, ranks) -> None:
    """The engine refuses LoRA under tensor parallelism; the operator says so before any pod crash-loops."""
    with pytest.raises(ValueError, match=rf"LoRA adapters are not sharded .* nodesPerReplica is {ranks}\)"):
        parse(body([VET], engine=engine))


def engine_pod(b: dict) -> dict:
    return build_engine_deployment(parse(b))["spec"]["template"]


def test_the_engine_gets_lora_flags_the_modules_file_and_read_only_claims() -> None:
    template = engine_pod(body([VET, CATS, DIET]))
    (engine,) = template["spec"]["containers"]
    assert engine["args"][-7:] == ["--enable-lora", "--max-loras", "8", "--max-lora-rank", "64",
                                   "--lora-modules-file", MODULES_FILE]
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["lora-modules"] == {"name": "lora-modules", "configMap": {"name": "pets-adapters"}}
    claim = claim_volume_name("adapters")
    assert volumes[claim] == {"name": claim, "persistentVolumeClaim": {"claimName": "adapters", "readOnly": True}}
    mounts = {m["name"]: m for m in engine["volumeMounts"]}
    assert mounts[claim] == {"name": claim, "mountPath": "/adapters/adapters", "readOnly": True}
    assert mounts["lora-modules"]["readOnly"] is True
    env = {v["name"]: v.get("value") for v in engine["env"]}
    assert env["HF_HOME"] == "/models/cache/huggingface" and "HF_HUB_OFFLINE" not in env   # Hub adapters at run time
    (download,) = template["spec"]["initContainers"]
    assert download["args"] == ["download", "clinic/base-model", "--termination-log", "/dev/termination-log",
                                "--lora-modules-file", MODULES_FILE]
    assert {"name": "lora-modules", "mountPath": "/etc/pagedkube/adapters", "readOnly": True} in download["volumeMounts"]
    plain = engine_pod(body())
    (plain_engine,) = plain["spec"]["containers"]
    assert "--enable-lora" not in plain_engine["args"]
    assert {v["name"]: v.get("value") for v in plain_engine["env"]}["HF_HUB_OFFLINE"] == "1"


def test_the_config_map_lists_the_adapters_as_vllm_lora_modules() -> None:
    cm = build_adapters_config_map(parse(body([VET, CATS])))
    assert cm["metadata"]["name"] == naming.adapters_config_map_name("pets") == "pets-adapters"
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert json.loads(cm["data"]["lora-modules.json"]) == [
        {"name": "vet-notes", "path": "clinic/vet-notes-lora"},
        {"name": "cat-care", "path": "/adapters/adapters/cat-care/v2"}]
    kinds = [c["kind"] for c in build_children(parse(body([VET])), with_service_monitor=False)]
    assert kinds.index("ConfigMap") < kinds.index("Deployment")
    assert "ConfigMap" not in [c["kind"] for c in build_children(parse(body()), with_service_monitor=False)]


def test_adding_and_removing_adapters_leaves_the_pod_template_alone() -> None:
    """What would roll the engines: only LoRA on/off, or a claim's first adapter coming or its last going."""
    dogs = {"name": "dogs", "source": "pvc://adapters/dogs"}   # another folder of the same claim
    first = engine_pod(body([VET, CATS]))
    assert engine_pod(body([CATS, DIET])) == first
    assert engine_pod(body([DIET, dogs, VET])) == first
    no_claim = engine_pod(body([VET]))
    assert no_claim != first     # the claim's last adapter went: its volume goes
    assert engine_pod(body([DIET])) == no_claim
    assert engine_pod(body([], engine={"maxLoras": 8})) == no_claim   # LoRA on, none yet: the same pods
    assert engine_pod(body()) != no_claim


def test_config_map_edits_are_all_that_change() -> None:
    before = {(c["kind"], c["metadata"]["name"]): c for c in build_children(parse(body([VET, DIET])),
                                                                          with_service_monitor=True)}
    after = {(c["kind"], c["metadata"]["name"]): c for c in build_children(parse(body([DIET, {**VET, "name": "v2"}])),
                                                                         with_service_monitor=True)}
    assert before.keys() == after.keys()
    assert [k for k in before if before[k] != after[k]] == [("ConfigMap", "pets-adapters")]
