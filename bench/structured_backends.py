"""xgrammar against llguidance, the two grammar libraries vLLM offers, on our tokenizers.

For each tokenizer (SmolLM2-135M's, from the default GGUF; Qwen2's, from --qwen2-tokenizer,
a folder with vocab.json and merges.txt): building the tokenizer tables, compiling each
schema of the validity test's set (tests/helpers/schema_factory.py) cold and again from a
cache, and the next-token mask per token, one sequence at a time (batch 1) and 32 at once,
walking each grammar with random allowed tokens (the same walk for both libraries where
their masks agree; the count of disagreeing steps is printed, it should be 0).

    .venv/bin/python bench/structured_backends.py --qwen2-tokenizer /path/to/qwen2 --schemas 40

Recorded in docs/benchmarks.md, "Structured outputs: backend".
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from schema_factory import schema_set  # noqa: E402


def smollm2_tokenizer():
    from transformers import PreTrainedTokenizerFast

    from pagedkube.engine.gguf.prepare import gguf_model_dir
    from pagedkube.model_source import resolve_model_source

    folder = gguf_model_dir(resolve_model_source(None).path)
    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json")), 49152, [2]


def qwen2_tokenizer(folder: str):
    """Qwen2's byte-level BPE from its vocab.json and merges.txt, with its three special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE.from_file(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
    assert len(tok) == 151646, len(tok)
    return tok, 151936, [tok.convert_tokens_to_ids("<|im_end|>")]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def walk(schemas, fill, accept, new_state, vocab: int, steps: int, batch: int, seed: int,
         stops: list[int]) -> float:
    """Mean seconds per token of `fill` while 32 grammars are walked `steps` tokens each with random
    allowed tokens (a stop token only when nothing else is allowed; then the grammar starts over):
    batch 32 = all 32 in one fill per step, batch 1 = one grammar at a time."""
    rng = random.Random(seed)
    groups = [[schemas[i % len(schemas)] for i in range(32)]] if batch == 32 else \
        [[schemas[i % len(schemas)]] for i in range(32)]
    total, count = 0.0, 0
    for group in groups:
        states = [new_state(g) for g in group]
        mask = torch.zeros(len(group), (vocab + 31) // 32, dtype=torch.int32)
        for _ in range(steps):
            start = time.perf_counter()
            fill(states, mask)
            total += time.perf_counter() - start
            count += len(group)
            for row, state in enumerate(states):
                bits = (mask[row, :, None] >> torch.arange(32)) & 1
                allowed = bits.flatten()[:vocab].nonzero().flatten().tolist()
                going_on = [t for t in allowed if t not in stops]
                token = rng.choice(going_on) if going_on else None
                if token is None or not accept(state, token):
                    states[row] = new_state(group[row])
    return total / count


def bench_xgrammar(tokenizer, vocab, stops, schemas, steps):
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=stops)
    tables = time.perf_counter() - t0
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True)
    compiled, cold, warm = {}, [], []
    for i, schema in enumerate(schemas):
        text = json.dumps(schema)
        t0 = time.perf_counter()
        compiled[i] = compiler.compile_json_schema(text, any_whitespace=False)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        compiler.compile_json_schema(text, any_whitespace=False)
        warm.append(time.perf_counter() - t0)
    new_state = lambda i: xgr.GrammarMatcher(compiled[i])  # noqa: E731

    def fill(states, mask):
        for row, m in enumerate(states):
            m.fill_next_token_bitmask(mask, row)

    masks = {b: walk(list(compiled), fill, lambda m, t: m.accept_token(t), new_state, vocab, steps, b, 0, stops)
             for b in (1, 32)}
    return tables, cold, warm, masks


def bench_llguidance(tokenizer, vocab, stops, schemas, steps):
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=stops[0])
    tables = time.perf_counter() - t0
    grammars, cold, warm = {}, [], []
    for i, schema in enumerate(schemas):
        t0 = time.perf_counter()
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                                 defaults={"whitespace_flexible": False})
        matcher = llguidance.LLMatcher(lltok, grammar)
        cold.append(time.perf_counter() - t0)
        if matcher.is_error():
            continue
        grammars[i] = grammar
        t0 = time.perf_counter()
        llguidance.LLMatcher(lltok, grammar)
        warm.append(time.perf_counter() - t0)
    executor = llguidance.LLExecutor(2)
    new_state = lambda i: llguidance.LLMatcher(lltok, grammars[i])  # noqa: E731

    def fill(states, mask):
        if len(states) == 1:
            lt.fill_next_token_bitmask(states[0], mask, 0)
        else:
            lt.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(states)], mask)

    masks = {b: walk(list(grammars), fill, lambda m, t: m.consume_token(t), new_state, vocab, steps, b, 0, stops)
             for b in (1, 32)}
    return tables, cold, warm, masks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--qwen2-tokenizer", help="a folder with Qwen2's vocab.json and merges.txt")
    p.add_argument("--schemas", type=int, default=40)
    p.add_argument("--steps", type=int, default=60, help="mask steps per batch size")
    args = p.parse_args()
    torch.set_num_threads(1)
    tokenizers = {"SmolLM2 (49,152)": smollm2_tokenizer()}
    if args.qwen2_tokenizer:
        tokenizers["Qwen2 (151,936)"] = qwen2_tokenizer(args.qwen2_tokenizer)
    schemas = schema_set(args.schemas)
    print(f"load average {os.getloadavg()[0]:.2f}; {len(schemas)} schemas; {os.cpu_count()} CPUs")
    for name, (tok, vocab, stops) in tokenizers.items():
        for lib, run in (("xgrammar", bench_xgrammar), ("llguidance", bench_llguidance)):
            tables, cold, warm, masks = run(tok, vocab, stops, schemas, args.steps)
            print(f"{name:18} {lib:10} tables {tables * 1e3:7.0f} ms | compile cold p50 {pct(cold, .5) * 1e3:7.2f} "
                  f"p99 {pct(cold, .99) * 1e3:7.1f} ms, cached p50 {pct(warm, .5) * 1e6:6.0f} us | mask/token "
                  f"batch 1 {masks[1] * 1e6:6.1f} us, batch 32 {masks[32] * 1e6:6.1f} us "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
