"""ModelRunner against Hugging Face transformers, in float32 on CPU.

Several sequences of different lengths share one flat batch, their blocks are
scattered through the pool, and prefill is chunked across two steps; every
token's logits must equal HF's full-sequence forward. Greedy decoding through
execute() with a trivial block allocator must reproduce HF's generate.
"""
from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from model_factory import FAMILIES, load_hf_model, make_tiny_model
from toolchain import require_cxx
from pagedkube.engine.config import EngineConfig
from pagedkube.engine.gguf.prepare import cache_root
from pagedkube.engine.loader import resolve_dtype
from pagedkube.engine.host_memory import available_host_memory, cgroup_headroom
from pagedkube.engine.model_config import ModelConfig
from pagedkube.engine.kv_pool import CPU_FREE_MEMORY_FRACTION
from pagedkube.engine.model_runner import ModelRunner
from pagedkube.engine.quant.q4_fused import q4_ext
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.sequence import ScheduledSeq, Sequence

BLOCK_SIZE = 4
NUM_BLOCKS = 64
VARIANTS = {name: (name, {}) for name in FAMILIES}
VARIANTS["llama-linear-rope"] = ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}})
VARIANTS["qwen2-sharded"] = ("qwen2", {"max_shard_size": "40KB"})


@pytest.fixture(scope="module", params=list(VARIANTS))
def model_dir(request, tmp_path_factory):
    family, overrides = VARIANTS[request.param]
    return make_tiny_model(family, tmp_path_factory.mktemp(request.param), **overrides)


def make_runner(path, **overrides) -> ModelRunner:
    kw = dict(model="builtin://tiny" if path is None else str(path), device="cpu", attention_backend="torch", block_size=BLOCK_SIZE,
              num_kv_blocks=NUM_BLOCKS, max_num_seqs=4)
    return ModelRunner(EngineConfig(**{**kw, **overrides}))


def make_seq(name: str, token_ids: list[int], block_table: list[int]) -> Sequence:
    return Sequence(request_id=name, prompt_token_ids=token_ids,
                    params=SamplingParams(temperature=0.0), block_table=block_table)


def step_logits(runner: ModelRunner, batch: list[ScheduledSeq]) -> list[torch.Tensor]:
    """Every new token's logits, split per item (the runner itself only computes sampled rows)."""
    step = runner.prepare(batch)
    with torch.inference_mode():
        hidden = runner.model(step.input_ids, step.positions, runner.kv_caches, step.meta)
        logits = runner.model.compute_logits(hidden)
    return list(logits.split([item.num_new_tokens for item in batch]))


def test_logits_match_hf_with_scattered_blocks_and_chunked_prefill(model_dir):
    assert_logits_match_hf(make_runner(model_dir), model_dir, atol=1e-4)


def test_builtin_model_is_the_default_and_matches_hf():
    runner = make_runner(None)
    assert runner.model_config.architecture == "Qwen2ForCausalLM"
    assert_logits_match_hf(runner, runner.model_config.model_dir, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_logits_match_hf_on_cuda_with_triton(family, tmp_path):
    path = make_tiny_model(family, tmp_path / family)
    runner = make_runner(path, device="cuda", dtype="float32", attention_backend="triton")
    assert runner.backend.__name__.endswith("triton_backend")
    assert_logits_match_hf(runner, path, atol=1e-3)


def assert_logits_match_hf(runner: ModelRunner, model_dir, atol: float) -> None:
    hf = load_hf_model(model_dir)
    rng = random.Random(0)
    vocab = runner.model_config.vocab_size
    blocks = rng.sample(range(NUM_BLOCKS), NUM_BLOCKS)           # scattered, interleaved owners
    lengths = {"a": 13, "b": 7, "c": 21}
    seqs = {}
    for name, n in lengths.items():
        need = -(-(n + 2) // BLOCK_SIZE)                            # room for two decoded tokens
        seqs[name] = make_seq(name, [rng.randrange(vocab) for _ in range(n)], [blocks.pop() for _ in range(need)])
    a, b, c = seqs["a"], seqs["b"], seqs["c"]
    got = {name: [] for name in seqs}
    # Step 1: chunks of a and c, all of b. Step 2: the rest of a and c, b decodes. Step 3: all decode.
    first = [ScheduledSeq(a, 6), ScheduledSeq(b, 7), ScheduledSeq(c, 9)]
    for item, logits in zip(first, step_logits(runner, first)):
        got[item.seq.request_id].append(logits)
        item.seq.num_computed_tokens += item.num_new_tokens
    b.append_token(int(got["b"][0][-1].argmax()))
    second = [ScheduledSeq(c, 12), ScheduledSeq(b, 1), ScheduledSeq(a, 7)]
    for item, logits in zip(second, step_logits(runner, second)):
        got[item.seq.request_id].append(logits)
        item.seq.num_computed_tokens += item.num_new_tokens
        item.seq.append_token(int(logits[-1].argmax()))
    third = [ScheduledSeq(s, 1) for s in (b, c, a)]                 # a batch of decodes
    for item, logits in zip(third, step_logits(runner, third)):
        got[item.seq.request_id].append(logits)
    for name, seq in seqs.items():
        ours = torch.cat(got[name]).cpu()
        with torch.inference_mode():
            theirs = hf(torch.tensor([seq.token_ids])).logits[0]
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)
        assert ours.argmax(-1).tolist() == theirs.argmax(-1).tolist()


def _allocate(seq: Sequence, free: list[int], num_tokens: int) -> None:
    while len(seq.block_table) * BLOCK_SIZE < num_tokens:
        seq.block_table.append(free.pop())


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_execute_matches_hf_generate(family, tmp_path):
    path = make_tiny_model(family, tmp_path / family)
    runner = make_runner(path)
    hf = load_hf_model(path)
    prompts = [[5, 17, 33, 9, 101, 7, 250, 3, 11], [44, 2, 90], [300, 301, 302, 303, 304, 305]]
    free = list(range(NUM_BLOCKS))
    seqs = [make_seq(str(i), p, []) for i, p in enumerate(prompts)]
    max_new = 6
    for _ in range(max_new):
        batch = [ScheduledSeq(s, s.num_tokens - s.num_computed_tokens) for s in seqs]
        for s in seqs:
            _allocate(s, free, s.num_tokens)
        outputs = runner.execute(batch)
        for item, out in zip(batch, outputs):
            item.seq.num_computed_tokens += item.num_new_tokens
            item.seq.append_token(out.token_id)
    for s, prompt in zip(seqs, prompts):
        with torch.inference_mode():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert s.output_token_ids == expected


def test_execute_samples_only_items_that_reach_the_end(tmp_path):
    runner = make_runner(make_tiny_model("qwen2", tmp_path / "m"))
    full = make_seq("full", [1, 2, 3, 4, 5], [3, 9])
    chunk = make_seq("chunk", [6, 7, 8, 9, 10, 11], [4, 0])
    outputs = runner.execute([ScheduledSeq(chunk, 4), ScheduledSeq(full, 5)])
    assert outputs[0] is None
    assert outputs[1] is not None and 0 <= outputs[1].token_id < runner.model_config.vocab_size


def test_step_errors_are_value_errors(tmp_path):
    runner = make_runner(make_tiny_model("qwen2", tmp_path / "m"))
    seq = make_seq("s", [1, 2, 3, 4, 5], [1])
    with pytest.raises(ValueError, match="block_table has 1 blocks"):
        runner.execute([ScheduledSeq(seq, 5)])
    with pytest.raises(ValueError, match="cannot compute tokens"):
        runner.execute([ScheduledSeq(make_seq("t", [1, 2], [1]), 3)])
    with pytest.raises(ValueError, match="block ids must be in"):
        runner.execute([ScheduledSeq(make_seq("u", [1, 2], [NUM_BLOCKS]), 2)])


def test_a_decode_only_step_is_prepared_as_the_general_path_prepares_it(tmp_path):
    """prepare()'s decode-only path (Python lists) gives the general path's tensors exactly, for
    decodes at block edges, one token of a longer sequence that samples nothing, and tables of
    unequal widths; its errors are the general path's."""
    import random
    runner = make_runner(make_tiny_model("qwen2", tmp_path / "m"), max_model_len=40)
    rng = random.Random(0)
    for trial in range(30):
        batch = []
        for i in range(rng.randint(1, 6)):
            length = rng.randint(1, 36)
            seq = make_seq(f"s{trial}-{i}", [rng.randint(1, 60) for _ in range(length)],
                           rng.sample(range(NUM_BLOCKS), -(-length // BLOCK_SIZE) + rng.randint(0, 2)))
            seq.num_computed_tokens = length - 1 if rng.random() < 0.8 else rng.randint(0, length - 1)
            batch.append(ScheduledSeq(seq, 1))
        fast, general = runner._prepare_decodes(batch), runner._prepare_general(batch)
        assert fast.sample_items == general.sample_items
        for name in ("input_ids", "positions", "sample_token_index"):
            a, b = getattr(fast, name), getattr(general, name)
            assert a.dtype == b.dtype and torch.equal(a, b), name
        for name in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
            a, b = getattr(fast.meta, name), getattr(general.meta, name)
            assert a.dtype == b.dtype and torch.equal(a, b), name
        assert (fast.meta.max_query_len, fast.meta.max_seq_len) == (general.meta.max_query_len, general.meta.max_seq_len)
    outside = make_seq("outside", [1, 2], [NUM_BLOCKS])              # a block id past the pool
    too_long = make_seq("long", list(range(1, 42)), list(range(11)))  # position 40 = max_model_len
    outside.num_computed_tokens, too_long.num_computed_tokens = 1, 40
    for seq, match in ((outside, "block ids must be in"), (too_long, "exceed max_model_len")):
        for prepare in (runner._prepare_decodes, runner._prepare_general):
            with pytest.raises(ValueError, match=match):
                prepare([ScheduledSeq(seq, 1)])


def test_kv_pool_shape_and_default_size(tmp_path):
    path = make_tiny_model("llama", tmp_path / "m")
    runner = make_runner(path)
    assert runner.num_kv_blocks == NUM_BLOCKS
    assert len(runner.kv_caches) == 2
    assert all(k.shape == v.shape == (NUM_BLOCKS, BLOCK_SIZE, 2, 16) for k, v in runner.kv_caches)
    assert runner.max_model_len == 512
    # Default on CPU: half the memory available, capped at max_num_seqs full-length sequences.
    capped = make_runner(path, num_kv_blocks=None, max_num_seqs=3)
    assert capped.num_kv_blocks == 3 * 512 // BLOCK_SIZE
    per_block = 2 * 2 * BLOCK_SIZE * 2 * 16 * 4
    sized = make_runner(path, num_kv_blocks=None, kv_cache_memory=100 * per_block + 5)
    assert sized.num_kv_blocks == 100
    # The pool's pages are the kernel's zero pages until written: reserving GBs here costs nothing.
    before = available_host_memory()
    default = make_runner(path, num_kv_blocks=None, max_num_seqs=10**6)
    after = available_host_memory()
    expected = [int(m * CPU_FREE_MEMORY_FRACTION) // per_block for m in (before, after)]
    assert min(expected) * 0.9 <= default.num_kv_blocks <= max(expected) * 1.1, (default.num_kv_blocks, expected)


def test_the_cgroup_limit_bounds_the_memory_counted_available(tmp_path):
    v2, v1, none = tmp_path / "v2", tmp_path / "v1", tmp_path / "none"
    (v1 / "memory").mkdir(parents=True)
    v2.mkdir(), none.mkdir()
    (v2 / "memory.max").write_text("1073741824\n")
    (v2 / "memory.current").write_text("268435456\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")   # v1's "no limit"
    (v1 / "memory" / "memory.usage_in_bytes").write_text("5\n")
    assert cgroup_headroom(v2) == 768 * 2**20
    assert cgroup_headroom(v1) is None and cgroup_headroom(none) is None
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_headroom(v2) is None
    (v2 / "memory.max").write_text("1000\n")
    assert available_host_memory(v2) == 0                      # usage over the limit: nothing to take
    assert available_host_memory(none) > 0


def test_sliding_window_caps_max_model_len(tmp_path):
    path = make_tiny_model("mistral", tmp_path / "m")      # sliding_window 256 < max_position_embeddings 512
    assert make_runner(path).max_model_len == 256
    assert make_runner(path, max_model_len=100).max_model_len == 100
    with pytest.raises(ValueError, match="sliding_window"):
        make_runner(path, max_model_len=300)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        make_runner(path, max_model_len=1000)


def test_loader_errors(tmp_path):
    with pytest.raises(ValueError, match="does-not-exist"):
        make_runner(tmp_path / "does-not-exist")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        make_runner(tmp_path / "empty")
    path = make_tiny_model("llama", tmp_path / "m")
    config = json.loads((path / "config.json").read_text())

    def with_config(name: str, **changes) -> str:
        target = tmp_path / name
        target.mkdir()
        (target / "config.json").write_text(json.dumps({**config, **changes}))
        (target / "model.safetensors").symlink_to(path / "model.safetensors")
        return target

    with pytest.raises(ValueError, match="GPT2LMHeadModel.*supported.*LlamaForCausalLM"):
        make_runner(with_config("gpt2", architectures=["GPT2LMHeadModel"]))
    yarn = {**config["rope_parameters"], "rope_type": "yarn"}
    with pytest.raises(ValueError, match="unsupported rope type 'yarn'"):
        make_runner(with_config("yarn", rope_parameters=yarn))
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="model.safetensors"):
        make_runner(no_weights)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="qkv_proj"):
        make_runner(path)


def test_dtype_resolution():
    cfg = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                                 "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
                                 "torch_dtype": "float16"})
    assert resolve_dtype("auto", torch.device("cpu"), cfg) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda"), cfg) == torch.float16   # the checkpoint's dtype
    assert resolve_dtype("bfloat16", torch.device("cpu"), cfg) == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", torch.device("cpu"), cfg)
    assert resolve_dtype("float32", torch.device("cuda"), cfg) == torch.float32  # --dtype wins


def test_bfloat16_runner_tracks_float32(tmp_path):
    path = make_tiny_model("qwen3", tmp_path / "m")
    runs = {}
    for dtype in ("float32", "bfloat16"):
        runner = make_runner(path, dtype=dtype)
        assert runner.kv_caches[0][0].dtype == getattr(torch, dtype)
        seqs = [make_seq("a", [5, 6, 7, 8, 9, 10], [2, 7]), make_seq("b", [11, 12, 13], [4])]
        first = [ScheduledSeq(s, s.num_tokens) for s in seqs]
        logits = [chunk[-1] for chunk in step_logits(runner, first)]
        for s in seqs:
            s.num_computed_tokens = s.num_tokens
            s.append_token(3)
        logits += [chunk[-1] for chunk in step_logits(runner, [ScheduledSeq(s, 1) for s in seqs])]
        runs[dtype] = torch.stack(logits)
    assert runs["bfloat16"].dtype == torch.float32                 # logits are always float32
    torch.testing.assert_close(runs["bfloat16"], runs["float32"], atol=0.1, rtol=0.05)


@pytest.mark.parametrize("kind, quantization, packed", [
    ("Q4_0", "auto", True),       # the file's blocks served as they are
    ("Q4_0", "none", False),      # dequantized: the float reference
    ("F32", "auto", False),
    ("F32", "int8", True),        # requantized at load
])
def test_auto_dtype_is_float32_on_cpu_packed_weights_or_not(tmp_path, kind, quantization, packed):
    """bf16 activations cost fidelity (docs/benchmarks.md "Fidelity per component"): never by default."""
    from gguf_factory import write_tiny_gguf
    from pagedkube.engine.runner_setup import serves_quantized_weights
    path = write_tiny_gguf(tmp_path / f"tiny-{kind}.gguf", "llama", kind)
    config = EngineConfig(model=str(path), device="cpu", quantization=quantization, num_kv_blocks=8,
                          attention_backend="torch")
    assert serves_quantized_weights(config, ModelConfig.from_pretrained(str(path))) is packed
    runner = ModelRunner(config)
    assert runner.dtype == torch.float32
    # the KV cache: float16 beside packed projections our exact kernel runs (resolve_kv_cache_dtype),
    # else the activations'
    exact_packed = packed and quantization == "auto" and q4_ext(cache_root()) is not None
    assert runner.kv_caches[0][0].dtype == (torch.float16 if exact_packed else torch.float32) == runner.kv_dtype


def test_kv_cache_dtype_resolution_and_a_forced_one(tmp_path, monkeypatch):
    from gguf_factory import write_tiny_gguf
    from pagedkube.engine.loader import resolve_kv_cache_dtype
    require_cxx()
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_kv_cache_dtype("auto", torch.float32, cpu, calibrated=True) == torch.float16
    assert resolve_kv_cache_dtype("auto", torch.float32, cpu, calibrated=False) == torch.float32
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, cpu, calibrated=True) == torch.bfloat16
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, cuda, calibrated=True) == torch.bfloat16
    assert resolve_kv_cache_dtype("float32", torch.float32, cpu, calibrated=True) == torch.float32
    assert resolve_kv_cache_dtype("bfloat16", torch.bfloat16, cuda, calibrated=False) == torch.bfloat16
    with pytest.raises(ValueError, match="Triton"):
        resolve_kv_cache_dtype("float16", torch.bfloat16, cuda, calibrated=False)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(model="builtin://tiny", kv_cache_dtype="fp8")
    # forced float32 beside packed weights: the pool is float32 and twice the bytes per block,
    # so the same memory holds half the blocks
    path = write_tiny_gguf(tmp_path / "tiny-Q4_0.gguf", "llama", "Q4_0")
    runners = {kv: ModelRunner(EngineConfig(model=str(path), device="cpu", kv_cache_dtype=kv, kv_cache_memory=2**22,
                                            attention_backend="torch", decode_capture="off"))
               for kv in ("auto", "float32")}
    assert runners["auto"].kv_caches[0][0].dtype == torch.float16
    assert runners["float32"].kv_caches[0][0].dtype == torch.float32
    assert runners["auto"].num_kv_blocks == 2 * runners["float32"].num_kv_blocks
    # without our exact kernel (no C++ toolchain) the projections round to bf16, and the cache
    # stays in the activation dtype (a float16 one cost agreement there)
    monkeypatch.setattr("pagedkube.engine.loader.q4_ext", lambda cache: None)
    assert resolve_kv_cache_dtype("auto", torch.float32, cpu, calibrated=True) == torch.float32
