"""Builds the built-in tiny model (docs/design.md "Models") into pagedkube/builtin/tiny/.

    python scripts/make_tiny_model.py            # rebuild the committed model
    python scripts/make_tiny_model.py --check    # rebuild into a temp dir, compare sha256

End to end and deterministic: the corpus (scripts/data/petcare_corpus.txt) ->
a byte-level BPE trained with `tokenizers` -> a Qwen2 config -> a
Qwen2ForCausalLM trained from a fixed seed on the corpus rendered with the chat
template -> a complete Hugging Face directory. Seeds, thread count, data order
and step count are fixed and torch runs with deterministic algorithms, so a
rerun on the same machine and library versions reproduces every byte; another
CPU (other SIMD kernels) may differ in the last float bits of the weights.
It is a toy: it only knows the few hundred pet-care answers it has seen.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the BPE trainer's merge order must not depend on threads
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "scripts" / "data" / "petcare_corpus.txt"
OUT_DIR = ROOT / "pagedkube" / "builtin" / "tiny"
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", "README.md")

SEED = 0
NUM_THREADS = 1            # fixed: kernels' summation order depends on it (and 1 is fastest on a shared 2-core box)
VOCAB_SIZE = 2048          # upper bound; the corpus may support fewer merges
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
# Sizes: head_dim 32 (a power of two, as Triton kernels like) and GQA 4:2, so the
# engine's kernels see the same shapes as a real Qwen2; ~1M parameters, ~4 MB.
MODEL = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=2048, rope_theta=10000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=True)
# Training: ~2 minutes of one CPU core; the loss flattens near 0.1 (the corpus is memorised).
STEPS = 600
BATCH_SIZE = 16
LR = 3e-3
WARMUP = 60

# transformers' Qwen2Tokenizer.PRETOKENIZE_REGEX (GPT-2's, with single digits and
# case-insensitive contractions).
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                           r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# Qwen2's ChatML, without its default system prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def load_corpus(path: Path = CORPUS) -> list[list[dict]]:
    """Conversations: blank-line separated blocks of `role: text` lines."""
    conversations, current = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                conversations.append(current)
            current = []
            continue
        role, sep, content = line.partition(": ")
        if not sep or role not in ("system", "user", "assistant"):
            raise ValueError(f"{path}:{number}: expected 'system|user|assistant: text', got {line!r}")
        current.append({"role": role, "content": content.strip()})
    if current:
        conversations.append(current)
    return conversations


def render_chat(messages: list[dict]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def train_tokenizer(conversations: list[list[dict]]):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    # Qwen2's pipeline exactly: transformers 5 rebuilds a qwen2 tokenizer from
    # vocab and merges with this normalizer and pre-tokenizer whatever
    # tokenizer.json says, and pagedkube.tokenizer reads tokenizer.json as is;
    # identical pipelines keep the two in agreement.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [m["role"] + "\n" + m["content"] for conv in conversations for m in conv]
    tok.train_from_iterator(texts, trainer=trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(token) == i, (token, tok.token_to_id(token))
    return tok


def training_texts(conversations: list[list[dict]]) -> list[str]:
    """Each conversation twice: as a chat (what /v1/chat/completions sends) and as
    plain text ending in <|endoftext|> (so /v1/completions continues in English)."""
    chats = [render_chat(conv) for conv in conversations]
    plain = ["\n".join(m["content"] for m in conv if m["role"] != "system") + "<|endoftext|>"
             for conv in conversations]
    return chats + plain


def epoch_batches(examples: list, generator) -> list[list[int]]:
    """One epoch in random order, sorted by length within windows of a few
    batches so that a batch holds similar lengths (less padding, same data)."""
    import torch

    order = torch.randperm(len(examples), generator=generator).tolist()
    window = BATCH_SIZE * 8
    batches = []
    for lo in range(0, len(order), window):
        chunk = sorted(order[lo:lo + window], key=lambda i: (len(examples[i]), i))
        batches += [chunk[i:i + BATCH_SIZE] for i in range(0, len(chunk), BATCH_SIZE)]
    return batches[::-1]  # popped from the end


def train_model(tok, texts: list[str]):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    torch.set_num_threads(NUM_THREADS)
    torch.use_deterministic_algorithms(True)
    pad_id, eos_id = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    config = Qwen2Config(vocab_size=tok.get_vocab_size(), bos_token_id=None, eos_token_id=eos_id,
                         pad_token_id=pad_id, **MODEL)
    config.dtype = torch.float32
    model = Qwen2ForCausalLM._from_config(config, attn_implementation="eager", dtype=torch.float32)
    examples = [torch.tensor(tok.encode(t).ids) for t in texts]
    print(f"{len(examples)} examples, {sum(len(e) for e in examples)} tokens, "
          f"{sum(p.numel() for p in model.parameters())} parameters", file=sys.stderr)

    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
        (step + 1) / WARMUP, 0.1 + 0.45 * (1 + math.cos(math.pi * step / STEPS))))
    generator = torch.Generator().manual_seed(SEED)
    batches: list[list[int]] = []
    model.train()
    start = time.monotonic()
    for step in range(STEPS):
        if not batches:
            batches = epoch_batches(examples, generator)
        batch = [examples[i] for i in batches.pop()]
        width = max(len(e) for e in batch)
        input_ids = torch.full((len(batch), width), pad_id)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):  # right padding; pads are masked out of attention and loss
            input_ids[row, :len(ids)], labels[row, :len(ids)], mask[row, :len(ids)] = ids, ids, 1
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == STEPS - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  {time.monotonic() - start:6.0f}s", file=sys.stderr)
    model.eval()
    return model


def write_model_dir(out: Path, tok, model) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    # Older readers (transformers < 5, vLLM) look for these top-level keys.
    config.update(torch_dtype="float32", rope_theta=MODEL["rope_theta"])
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    eos_ids = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    generation = {"eos_token_id": eos_ids, "pad_token_id": eos_ids[1], "bos_token_id": None,
                  "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
        "clean_up_tokenization_spaces": False, "model_max_length": MODEL["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (out / "README.md").write_text(MODEL_CARD.format(
        vocab=tok.get_vocab_size(), params=sum(p.numel() for p in model.parameters()), steps=STEPS, **MODEL))


MODEL_CARD = """\
# tiny-petcare: pagedkube's built-in toy model

A {params:,}-parameter Qwen2 model ({num_hidden_layers} layers, hidden {hidden_size}, \
{num_attention_heads} query / {num_key_value_heads} KV heads, tied embeddings, float32) with a \
{vocab}-token byte-level BPE tokenizer and a ChatML chat template. It exists so that pagedkube runs
on a laptop CPU with no download (`LLM("builtin://tiny")` / `pagedkube serve --model builtin://tiny`).

It is a toy. It was trained for {steps} steps on a few hundred short pet-care conversations (dog
training, behaviour, health, feeding, grooming, puppies, senior dogs, when to see a vet) that the
pagedkube project wrote itself (`scripts/data/petcare_corpus.txt`). It answers in recognisable
English, mostly by recalling those answers; it knows nothing else and its advice is no substitute
for a vet.

Made by `python scripts/make_tiny_model.py`; `--check` rebuilds it and compares sha256 digests.
"""


def sha256s(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in FILES}


def build(out: Path) -> None:
    conversations = load_corpus()
    tok = train_tokenizer(conversations)
    model = train_model(tok, training_texts(conversations))
    write_model_dir(out, tok, model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"output folder (default {OUT_DIR})")
    parser.add_argument("--check", action="store_true",
                        help="rebuild into a temporary folder and compare sha256 with --out")
    args = parser.parse_args(argv)
    if not args.check:
        build(args.out)
        for name, digest in sha256s(args.out).items():
            print(f"{digest}  {name}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        expected, got = sha256s(args.out), sha256s(Path(tmp))
    for name in FILES:
        print(f"{'same' if expected[name] == got[name] else 'DIFFERENT':9s} {name}")
    return 0 if expected == got else 1


if __name__ == "__main__":
    sys.exit(main())
