"""Shared fixtures for the gateway tests."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = ["You are a helpful pet-care assistant.", "My dog Rex is a 3 year old beagle who loves walks.",
          "How often should I feed my puppy?", "Cats sleep a lot; that is normal."] * 4


def tokenizer_files() -> dict[str, str]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    config = {"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>", "bos_token": None}
    return {"tokenizer.json": tok.to_str(), "tokenizer_config.json": json.dumps(config)}


@pytest.fixture(scope="session")
def small_tokenizer_files() -> dict[str, str]:
    return tokenizer_files()
