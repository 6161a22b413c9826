"""Read an adapter in PEFT's format (what `PeftModel.save_pretrained` writes) and check it
against the model before it is served:

    adapter_config.json          r, lora_alpha, target_modules, use_rslora, rank_pattern,
                                 alpha_pattern, use_dora, bias, modules_to_save, ...
    adapter_model.safetensors    base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight  [r, in]
                                 base_model.model.model.layers.N.self_attn.q_proj.lora_B.weight  [out, r]

The delta of a projection is (x A^T B^T) * scale with scale = alpha / r, or alpha / sqrt(r)
with rsLoRA; rank_pattern/alpha_pattern override r and alpha per module as PEFT matches
them (a key matches a module whose dotted name ends with it). Pickled adapter_model.bin is
refused: loading an adapter must not run code.

Every problem is an AdapterError naming the file and what is wrong: the server answers it
with 400 (404 when the path does not exist) and the engine keeps serving.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from pagedkube.engine.model_config import ModelConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# the projections an adapter may target: HF module name -> (our fused projection, its slice)
TARGETS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "o_proj": ("o_proj", 0), "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
           "down_proj": ("down_proj", 0)}
PARENTS = {m: "self_attn" if fused in ("qkv_proj", "o_proj") else "mlp" for m, (fused, _) in TARGETS.items()}
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# adapter_config.json larger than this is not a PEFT config (a real one is ~1 KB)
MAX_CONFIG_BYTES = 1 << 20


class AdapterError(ValueError):
    """An adapter that cannot be served; `not_found` when its path does not exist."""

    def __init__(self, message: str, not_found: bool = False):
        super().__init__(message)
        self.not_found = not_found


@dataclass(frozen=True)
class LoRAWeights:
    """One projection's adapter: delta = (x @ a.T @ b.T) * scale."""
    a: torch.Tensor          # [r, in]
    b: torch.Tensor          # [out, r]
    scale: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass(frozen=True)
class LoRAAdapter:
    """A checked adapter in host memory: weights[(layer, "q_proj")]."""
    path: str
    rank: int
    weights: dict[tuple[int, str], LoRAWeights]

    @property
    def nbytes(self) -> int:
        return sum(w.a.nbytes + w.b.nbytes for w in self.weights.values())


def _pattern_value(patterns: dict, name: str, default):
    """PEFT's get_pattern_key: the first key the module's dotted name ends with."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def module_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of each HF projection of the model."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}


def read_config(path: Path) -> dict:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise AdapterError(f"adapter {path}: no {CONFIG_FILE} (a PEFT adapter directory has one)")
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise AdapterError(f"adapter {path}: {CONFIG_FILE} is over {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AdapterError(f"adapter {path}: {CONFIG_FILE} is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"adapter {path}: {CONFIG_FILE} is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"adapter {path}: peft_type {config.get('peft_type')!r}; only LORA adapters are served")
    if config.get("use_dora"):
        raise AdapterError(f"adapter {path}: DoRA (use_dora) adapters are not supported")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"adapter {path}: bias {config['bias']!r}; only bias 'none' is supported")
    if config.get("modules_to_save"):
        raise AdapterError(f"adapter {path}: modules_to_save {config['modules_to_save']!r} is not supported "
                           "(only the q/k/v/o/gate/up/down projections can be adapted)")
    for key in ("r", "lora_alpha"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise AdapterError(f"adapter {path}: {CONFIG_FILE} needs a positive {key!r}, got {value!r}")
    for key in ("rank_pattern", "alpha_pattern"):
        if not isinstance(config.get(key) or {}, dict):
            raise AdapterError(f"adapter {path}: {key} must be an object")
    return config


def load_adapter(path_str: str, cfg: ModelConfig, max_rank: int) -> LoRAAdapter:
    """The adapter at path_str checked against the model `cfg` (AdapterError if it does not fit)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path_str)
    if not path.is_dir():
        raise AdapterError(f"adapter path {path_str!r} is not a directory", not_found=not path.exists())
    config = read_config(path)
    file = path / WEIGHTS_FILE
    if not file.is_file():
        extra = " (pickled adapter_model.bin is refused: save with safe_serialization)" \
            if (path / "adapter_model.bin").exists() else ""
        raise AdapterError(f"adapter {path}: no {WEIGHTS_FILE}{extra}")
    shapes = module_shapes(cfg)
    pieces: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                m = _KEY.match(key)
                if m is None:
                    raise AdapterError(f"adapter {path}: tensor {key!r} is not a LoRA weight of a decoder projection "
                                       f"({', '.join(TARGETS)})")
                layer, parent, module, ab = int(m.group(1)), m.group(2), m.group(3), m.group(4)
                if module not in TARGETS or PARENTS[module] != parent:
                    raise AdapterError(f"adapter {path}: target module {module!r} (tensor {key!r}) is not one the "
                                       f"model has; adaptable: {', '.join(TARGETS)}")
                if layer >= cfg.num_hidden_layers:
                    raise AdapterError(f"adapter {path}: tensor {key!r} is for layer {layer}, the model has "
                                       f"{cfg.num_hidden_layers}")
                pieces.setdefault((layer, module), {})[ab] = f.get_tensor(key)
    except SafetensorError as e:
        raise AdapterError(f"adapter {path}: {WEIGHTS_FILE} is not a readable safetensors file ({e})") from None
    if not pieces:
        raise AdapterError(f"adapter {path}: {WEIGHTS_FILE} holds no LoRA weights")
    weights: dict[tuple[int, str], LoRAWeights] = {}
    for (layer, module), ab in sorted(pieces.items()):
        name = f"model.layers.{layer}.{PARENTS[module]}.{module}"
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"adapter {path}: {name} has lora_{''.join(ab)} without its pair")
        a, b = ab["A"], ab["B"]
        out_features, in_features = shapes[module]
        r = a.shape[0] if a.dim() == 2 else -1
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_features or b.shape != (out_features, r):
            raise AdapterError(f"adapter {path}: {name} lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit "
                               f"the model's {module} ({out_features} x {in_features}): an adapter of another model?")
        if r > max_rank:
            raise AdapterError(f"adapter {path}: rank {r} of {name} is above --max-lora-rank {max_rank}")
        if not (a.is_floating_point() and b.is_floating_point()):
            raise AdapterError(f"adapter {path}: {name} has non-float weights ({a.dtype}, {b.dtype})")
        alpha = float(_pattern_value(config.get("alpha_pattern") or {}, name, config["lora_alpha"]))
        scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        weights[(layer, module)] = LoRAWeights(a.float().contiguous(), b.float().contiguous(), scale)
    return LoRAAdapter(str(path), max(w.rank for w in weights.values()), weights)
