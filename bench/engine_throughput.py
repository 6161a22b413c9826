"""Offline throughput: pagedkube's LLM.generate against Hugging Face generate.

Both run the same workload on the same random model in one process:
>= 64 prompts of mixed lengths, mixed output lengths, greedy, EOS ignored so every
request produces exactly its own number of tokens. Hugging Face gets padded
batches (left padding, max_new_tokens = the longest output in the batch); only
each prompt's own tokens count towards its throughput, as a server would see.

    .venv/bin/python bench/engine_throughput.py                 # CPU: 40.5M-param Qwen2-style model, 1 thread
    .venv/bin/python bench/engine_throughput.py --device cuda   # Qwen2.5-0.5B's shape, HF batch 64
    .venv/bin/python bench/engine_throughput.py --model smollm2-135m-instruct   # a real model (GGUF)

Prints output tokens/s for both and the ratio (ours / HF). Record results in
docs/benchmarks.md, "Engine throughput (CPU)".
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

# Model shapes (random weights; the point is the arithmetic, not the text).
CPU_SHAPE = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=32000)                     # ~40M params
CUDA_SHAPE = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936)                   # Qwen2.5-0.5B


def make_model(path: Path, shape: dict, seed: int = 0) -> Path:
    """A random Qwen2-architecture checkpoint with a word-level tokenizer covering its vocab."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers
    config = tf.Qwen2Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True,
                            bos_token_id=0, eos_token_id=1, rope_theta=1_000_000.0)
    torch.manual_seed(seed)
    model = tf.Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(path)
    vocab = {f"t{i}": i for i in range(shape["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "t0", "eos_token": "t1"}))
    return path


def make_workload(num_prompts: int, prompt_lens: tuple[int, int], output_lens: tuple[int, int],
                  vocab_size: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(2, vocab_size) for _ in range(rng.randint(*prompt_lens))], rng.randint(*output_lens))
            for _ in range(num_prompts)]


def run_ours(model_dir: Path, workload, device: str) -> tuple[float, list[list[int]]]:
    from pagedkube.engine import LLM, SamplingParams
    # quantization none: the same dense arithmetic as HF (a GGUF would otherwise keep its blocks packed)
    llm = LLM(model=str(model_dir), device=device, dtype="float32" if device == "cpu" else "bfloat16", seed=0,
              quantization="none")
    warm = [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)] * 4
    llm.generate([p for p, _ in workload[:4]], warm)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in workload]
    _sync(device)
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in workload], params)
    _sync(device)
    elapsed = time.perf_counter() - start
    tokens = [o.outputs[0].token_ids for o in outs]
    assert [len(t) for t in tokens] == [n for _, n in workload], "ignore_eos run ended early"
    return elapsed, tokens


def run_hf(model_dir: Path, workload, device: str, batch_size: int) -> tuple[float, list[list[int]], int]:
    import transformers as tf
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    where = dict(pretrained_model_name_or_path=model_dir.parent, gguf_file=model_dir.name) if model_dir.is_file() \
        else dict(pretrained_model_name_or_path=model_dir)      # a GGUF file, or a Hugging Face directory
    model = tf.AutoModelForCausalLM.from_pretrained(**where, dtype=dtype).to(device).eval()
    pad = 0

    def batch_generate(items):
        width = max(len(p) for p, _ in items)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in items], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in items], device=device)
        max_new = max(n for _, n in items)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                                 min_new_tokens=max_new, do_sample=False, eos_token_id=None, pad_token_id=pad)
        return [row[width:width + n].tolist() for row, (_, n) in zip(out, items)]

    batch_generate(workload[:4])                                # warm-up
    _sync(device)
    start = time.perf_counter()
    tokens = []
    for i in range(0, len(workload), batch_size):
        tokens += batch_generate(workload[i:i + batch_size])
    _sync(device)
    return time.perf_counter() - start, tokens, sum(p.numel() for p in model.parameters())


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--hf-batch-size", type=int, default=None, help="default: 16 on CPU, 64 on CUDA")
    ap.add_argument("--model-dir", type=Path, default=None, help="reuse a model made by an earlier run")
    ap.add_argument("--model", default=None,
                    help="a real model instead of random weights: a name, GGUF file or directory (pagedkube.model_source)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: on a shared machine more threads mostly spin; 0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.num_prompts < 64:
        ap.error("--num-prompts must be >= 64")
    cpu = args.device == "cpu"
    shape = CPU_SHAPE if cpu else CUDA_SHAPE
    batch_size = args.hf_batch_size or (16 if cpu else 64)
    prompt_lens, output_lens = ((8, 128), (16, 96)) if cpu else ((32, 1024), (64, 512))
    if args.model:
        from pagedkube.model_source import resolve_model_source
        args.model_dir = resolve_model_source(args.model).path
        shape = {"model": args.model, "vocab_size": 49152 if "smollm2" in args.model else shape["vocab_size"]}
    workload = make_workload(args.num_prompts, prompt_lens, output_lens, shape["vocab_size"])
    num_output = sum(n for _, n in workload)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or make_model(Path(tmp) / "model", shape)
        hf_s, hf_tokens, num_params = run_hf(model_dir, workload, args.device, batch_size)
        ours_s, our_tokens = run_ours(model_dir, workload, args.device)
    agree = sum(a == b for a, b in zip(our_tokens, hf_tokens))
    print(f"model: {'' if args.model else 'Qwen2 shape '}{shape} ({num_params / 1e6:.1f}M params), device {args.device}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"workload: {len(workload)} prompts, prompt lens {prompt_lens}, output lens {output_lens}, "
          f"{num_output} output tokens; HF batch size {batch_size}")
    print(f"hf generate:   {hf_s:8.2f} s  {num_output / hf_s:9.1f} output tok/s")
    print(f"pagedkube LLM: {ours_s:8.2f} s  {num_output / ours_s:9.1f} output tok/s")
    print(f"ratio (pagedkube / hf): {hf_s / ours_s:.2f}x")
    print(f"identical greedy outputs: {agree}/{len(workload)} requests")


if __name__ == "__main__":
    main()
