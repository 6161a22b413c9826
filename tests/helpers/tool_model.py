"""A tiny model that really emits a Hermes tool call: the built-in model's tokenizer with
Qwen2.5's chat template (tests/data/chat_templates/qwen2.5.jinja), trained for a few hundred
steps to answer one conversation with a tool call, so that greedy decoding writes it
token by token like a Qwen2.5 model would:

    Let me check the calendar.
    <tool_call>
    {"name": "get_vet_slots", "arguments": {"date": "2026-12-03", "urgent": true}}
    </tool_call>

Cached by the hash of its inputs under ~/.cache/pagedkube/test-models/ (about 30 s to train
on 2 cores the first time).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from pagedkube.builtin import builtin_model_dir

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "chat_templates" / "qwen2.5.jinja"
TOOLS = [
    {"type": "function", "function": {
        "name": "get_vet_slots", "description": "Free appointment slots at the clinic on a date",
        "parameters": {"type": "object", "properties": {
            "date": {"type": "string", "pattern": "^2026-[01][0-9]-[0-3][0-9]$"},
            "urgent": {"type": "boolean"}}, "required": ["date", "urgent"]}}},
    {"type": "function", "function": {
        "name": "lookup_medication", "description": "Dose of a medication for a dog's weight",
        "parameters": {"type": "object", "properties": {
            "drug": {"type": "string", "maxLength": 30}, "weight_kg": {"type": "number", "minimum": 0.5,
                                                                       "maximum": 90}},
            "required": ["drug", "weight_kg"]}}},
]
MESSAGES = [{"role": "system", "content": "You book vet visits for dogs."},
            {"role": "user", "content": "My beagle limps since this morning. Can we see a vet tomorrow, 2026-12-03?"}]
CONTENT = "Let me check the calendar."
CALL = {"name": "get_vet_slots", "arguments": {"date": "2026-12-03", "urgent": True}}
ANSWER = f"{CONTENT}\n<tool_call>\n{json.dumps(CALL)}\n</tool_call>"
VERSION = 1


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pagedkube" / "test-models"
    key = hashlib.sha256(json.dumps([VERSION, TEMPLATE.read_text(), TOOLS, MESSAGES, ANSWER,
                                     (builtin_model_dir("tiny") / "model.safetensors").stat().st_size]).encode())
    return base / f"hermes-{key.hexdigest()[:16]}"


def hermes_tool_model() -> Path:
    out = _cache_dir()
    if (out / "done").is_file():
        return out
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    work = out.with_name(out.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(builtin_model_dir("tiny"), work)
    (work / "chat_template.jinja").write_text(TEMPLATE.read_text())
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(work / "tokenizer.json"))
    from pagedkube.tokenizer import Tokenizer

    ours = Tokenizer.from_pretrained(work)
    prompt_ids = ours.encode(ours.render_chat(MESSAGES, True, tools=TOOLS), add_special_tokens=False)
    answer_ids = tokenizer.encode(ANSWER, add_special_tokens=False) + [ours.eos_token_ids[0]]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(work, torch_dtype=torch.float32)
    ids = torch.tensor([prompt_ids + answer_ids])
    labels = torch.tensor([[-100] * len(prompt_ids) + answer_ids])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(300):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:   # memorized: greedy decoding reproduces ANSWER
            break
    model.eval()
    model.save_pretrained(work, safe_serialization=True)
    (work / "done").write_text(json.dumps({"loss": loss.item()}))
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    return out
