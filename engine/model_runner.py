"""The model side of an engine step (docs/interfaces.md, "Engine: runner seam").

The runner owns the model, the paged KV pool and the sampler's generator. Per
step it packs the scheduled tokens of every sequence into one flat batch, runs
the decoder once, and samples only where a sequence reaches its last known
token. It keeps no per-request state: everything it needs is on the Sequence
(token_ids, num_computed_tokens, block_table, params, sample_index,
num_output_tokens), so preemption or abort need nothing from it.

Step layout for two sequences, A computing 3 new tokens from position 5 and B
decoding 1 token at position 9, block_size 4:

    input_ids      [a5 a6 a7 | b9]           query_start_loc [0, 3, 4]
    positions      [ 5  6  7 |  9]           seq_lens        [8, 10]
    slot_mapping   [bt_A[1]*4+1, bt_A[1]*4+2, bt_A[1]*4+3 | bt_B[2]*4+1]

Under tensor parallelism (engine/distributed/) this runner is rank 0: it builds the step as
above, broadcasts it to the workers, runs its own shard, and samples from the logits the
workers' shards were gathered into. A worker runs another ModelRunner (`tp` given) whose
execute_shard takes the broadcast step; it never prepares or samples.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING

import torch

from pagedkube.engine.attention.metadata import AttentionMetadata
from pagedkube.engine.config import EngineConfig
from pagedkube.engine.decode_capture import DecodeCapture
from pagedkube.engine.gguf.prepare import cache_root
from pagedkube.engine.gguf.reader import GGUFFile
from pagedkube.engine.kv_pool import allocate_kv_pool, num_kv_blocks
from pagedkube.engine.distributed.checks import check_tensor_parallel
from pagedkube.engine.distributed.errors import WorkerFailed
from pagedkube.engine.distributed.executor import TPWorkers, move_tensors
from pagedkube.engine.distributed.sharding import ShardPlan
from pagedkube.engine.loader import load_model, resolve_dtype, resolve_kv_cache_dtype, resolve_quantization
from pagedkube.engine.model_config import ModelConfig
from pagedkube.engine.native_decode import NativeDecode, why_not_native
from pagedkube.engine.quant.q4_fused import q4_ext
from pagedkube.engine.runner_setup import (resolve_decode_capture, resolve_device, resolve_model_dir, select_backend,
                                           serves_quantized_weights)
from pagedkube.engine.sampler import Sampler
from pagedkube.engine.sequence import SampleOutput, ScheduledSeq, Sequence
from pagedkube.engine.structured.manager import StructuredOutputManager

if TYPE_CHECKING:
    from pagedkube.engine.distributed.worker import WorkerLink

log = logging.getLogger(__name__)

@dataclass
class StepInputs:
    input_ids: torch.Tensor      # [T]
    positions: torch.Tensor      # [T]
    meta: AttentionMetadata
    sample_items: list[int]      # batch indices that sample this step
    sample_token_index: torch.Tensor  # [len(sample_items)] row of each one's last token in the flat batch


class ModelRunner:
    def __init__(self, config: EngineConfig, tp: WorkerLink | None = None):
        """tp: a tensor-parallel worker's link to rank 0 (engine/distributed/worker.py); None on
        rank 0, which starts the workers itself when config.world_size > 1."""
        self.config = config
        self.model_config = ModelConfig.from_pretrained(resolve_model_dir(config.model))
        check_tensor_parallel(self.model_config, config.tensor_parallel_size, config.nnodes)
        if config.world_size > 1 and config.decode_capture in ("on", "native"):
            raise ValueError(f"decode_capture {config.decode_capture!r} is not supported with tensor_parallel_size > 1 yet")
        self.device = resolve_device(config.device)
        self.tp: TPWorkers | WorkerLink | None = tp
        if self.tp is None and config.world_size > 1:
            self.tp = TPWorkers(config)          # the workers load their shards while this one does
        try:
            self._build(config)
        except BaseException:
            self.shutdown()
            raise

    def _build(self, config: EngineConfig) -> None:
        tp = self.tp
        rank = tp.rank if tp is not None else 0
        if tp is not None and self.device.type == "cuda":
            self.device = torch.device("cuda", rank % config.tensor_parallel_size)   # its GPU in its pod
            torch.cuda.set_device(self.device)
        # one parse of a GGUF file serves the type check and the load (gguf-py's reader takes seconds)
        gguf = GGUFFile(self.model_config.gguf_file) if self.model_config.gguf_file is not None else None
        quantized = serves_quantized_weights(config, self.model_config, gguf)
        self.dtype = resolve_dtype(config.dtype, self.device, self.model_config)
        self.max_model_len = self.model_config.resolve_max_model_len(config.max_model_len)
        self.block_size = config.block_size
        # both flags auto: each packed projection's kernel is measured here (engine/quant/calibrate.py);
        # an explicit --quantization or --dtype is taken as given
        calibrate = quantized and config.quantization == "auto" and config.dtype == "auto"
        # our C++ kernels, where the GGUF default path loads them anyway (the float path keeps torch's)
        kernels = (q4_ext(cache_root()) if calibrate and self.device.type == "cpu" and self.dtype == torch.float32
                   else None)
        self.backend = select_backend(config.attention_backend, self.device, kernels)
        self.kv_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, self.dtype, self.device, calibrate)
        shard = None
        if tp is not None:
            method = resolve_quantization(config.quantization, self.model_config)
            shard = ShardPlan(self.model_config, rank, tp.world_size,
                              quantize_method=method if method in ("int8", "int4") else None)
        self.model = load_model(self.model_config, self.backend, self.device, self.dtype, self.max_model_len,
                                config.quantization, gguf=gguf, calibrate=calibrate, shard=shard)
        del gguf
        self.lora = self._lora_manager() if config.enable_lora else None   # its slots before the KV pool's share
        cfg = shard.local if shard is not None else self.model_config   # this rank's heads and KV heads
        self.num_kv_blocks = num_kv_blocks(config, cfg.kv_bytes_per_block(self.block_size, self.kv_dtype.itemsize),
                                           self.max_model_len, self.device)
        self.tp_group = None
        if tp is not None:
            from pagedkube.engine.distributed.layers import parallelize

            self.num_kv_blocks, self.tp_group = tp.agree(self.num_kv_blocks, self.device)
            parallelize(self.model, self.tp_group, self.model_config.vocab_size)
        capture = resolve_decode_capture(config, self.device, tensor_parallel=tp is not None,
                                         why_not_native=why_not_native(self.model, kernels))
        # A captured decode's padding rows write one extra block past the pool (decode_capture.py)
        pad_block = capture in ("on", "background")
        shape = (self.num_kv_blocks + pad_block, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_caches = allocate_kv_pool(cfg.num_hidden_layers, shape, self.kv_dtype, self.device)
        generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.sampler = Sampler(cfg.eos_token_ids, generator)
        self.decode_capture: DecodeCapture | NativeDecode | None = None
        if capture == "native":
            self.decode_capture = NativeDecode(self.model, self.kv_caches, kernels)
        elif capture != "off":
            self.decode_capture = DecodeCapture(self.model, self.kv_caches, config.decode_capture_sizes,
                                                self.block_size, self.num_kv_blocks, self.max_model_len, self.device,
                                                background=capture == "background")

    def _lora_manager(self):
        """Adapter slots in every projection (engine/lora/): Triton kernels on CUDA, grouped matmuls elsewhere."""
        from pagedkube.engine.lora.manager import LoRAManager

        use_triton = False
        if self.device.type == "cuda":
            try:
                import_module("pagedkube.engine.lora.triton_punica")
                use_triton = True
            except ImportError as e:
                log.warning("triton LoRA kernels unavailable (%s); using grouped torch matmuls", e)
        cfg = self.config
        return LoRAManager(self.model, self.model_config, max_loras=cfg.max_loras, max_rank=cfg.max_lora_rank,
                           max_cpu_loras=cfg.max_cpu_loras or cfg.max_loras, device=self.device, dtype=self.dtype,
                           use_triton=use_triton)

    def execute(self, batch: list[ScheduledSeq], structured: StructuredOutputManager | None = None) \
            -> list[SampleOutput | None]:
        """One forward pass; a token for each sequence that samples. `structured` builds the grammar
        bitmask of the constrained ones, on the CPU while the device runs the forward (CUDA launches
        are asynchronous), and the sampler applies it."""
        if not batch:
            return []
        step = self.prepare(batch)
        if not isinstance(self.tp, TPWorkers):
            return self._execute(batch, step, structured)
        try:
            self.tp.broadcast_step(step)
            return self._execute(batch, step, structured)
        except WorkerFailed as exc:        # a collective failed: say which worker, if one has exited
            raise self.tp.explain(exc) from exc

    def _execute(self, batch: list[ScheduledSeq], step: StepInputs, structured: StructuredOutputManager | None) \
            -> list[SampleOutput | None]:
        outputs: list[SampleOutput | None] = [None] * len(batch)
        if self.lora is not None:
            self.lora.prepare_step([item.seq.lora_request for item in batch], [item.num_new_tokens for item in batch])
        try:
            self._run(batch, step, structured, outputs)
        finally:
            if self.lora is not None:
                self.lora.end_step()
        return outputs

    def _run(self, batch: list[ScheduledSeq], step: StepInputs, structured: StructuredOutputManager | None,
             outputs: list[SampleOutput | None]) -> None:
        with torch.inference_mode():
            hidden = self.decode_capture.run(step) if self.decode_capture is not None else None
            if hidden is None:                   # not captured, or a step no bucket takes: eager
                hidden = self.model(step.input_ids, step.positions, self.kv_caches, step.meta)
            if step.sample_items:
                seqs = [batch[i].seq for i in step.sample_items]
                mask = structured.bitmask(seqs) if structured is not None else None
                logits = self.model.compute_logits(hidden[step.sample_token_index])
                samples = self.sampler(logits, seqs, mask)
                for i, sample in zip(step.sample_items, samples):
                    outputs[i] = sample

    def execute_shard(self, step: StepInputs) -> None:
        """A tensor-parallel worker's part of a step rank 0 broadcast: the forward pass on this
        rank's shard, and its vocabulary shard of the logits for rank 0's sampler."""
        step = move_tensors(step, self.device)
        with torch.inference_mode():
            hidden = self.model(step.input_ids, step.positions, self.kv_caches, step.meta)
            if step.sample_items:
                self.model.lm_head(hidden[step.sample_token_index])

    def check_workers(self) -> None:
        if isinstance(self.tp, TPWorkers):
            self.tp.check_alive()

    def shutdown(self) -> None:
        """Stops a tensor-parallel engine's workers (rank 0); a no-op otherwise."""
        if isinstance(self.tp, TPWorkers):
            self.tp.shutdown()

    def prepare(self, batch: list[ScheduledSeq]) -> StepInputs:
        """Flat step tensors from the batch: Python builds per-sequence lists once,
        torch ops expand them to per-token positions and slots. A step where every sequence
        decodes one token (most steps) is built from Python lists alone (_prepare_decodes)."""
        if batch and all(item.num_new_tokens == 1 for item in batch):
            return self._prepare_decodes(batch)
        return self._prepare_general(batch)

    def _check_item(self, seq: Sequence, start: int, end: int) -> int:
        """The blocks tokens [start, end) of seq need; ValueError when the step cannot compute them."""
        if end - start < 1 or end > seq.num_tokens:
            raise ValueError(f"request {seq.request_id}: cannot compute tokens [{start}, {end}) "
                             f"of a sequence with {seq.num_tokens}")
        if end > self.max_model_len:
            raise ValueError(f"request {seq.request_id}: {end} tokens exceed max_model_len {self.max_model_len}")
        num_blocks = -(-end // self.block_size)
        if len(seq.block_table) < num_blocks:
            raise ValueError(f"request {seq.request_id}: block_table has {len(seq.block_table)} blocks, "
                             f"{end} tokens need {num_blocks}")
        return num_blocks

    def _check_tables(self, tables: torch.Tensor, block_tables: list[list[int]]) -> None:
        if int(tables.max()) >= self.num_kv_blocks or int(tables.min()) < 0:
            raise ValueError(f"block ids must be in [0, {self.num_kv_blocks}), got {block_tables}")

    def _prepare_decodes(self, batch: list[ScheduledSeq]) -> StepInputs:
        """prepare() of a step where every sequence decodes one token: the same tensors, from
        Python lists (a handful of tensor constructions instead of ~25 torch ops: ~0.1 ms of a
        one-client step)."""
        bs = self.block_size
        token_ids, positions, slots, block_tables = [], [], [], []
        for item in batch:
            seq, pos = item.seq, item.seq.num_computed_tokens
            num_blocks = self._check_item(seq, pos, pos + 1)
            table = seq.block_table[:num_blocks]
            token_ids.append(seq.token_ids[pos])
            positions.append(pos)
            slots.append(table[-1] * bs + pos % bs)
            block_tables.append(table)
        width = max(len(table) for table in block_tables)
        tables = torch.tensor([table + [0] * (width - len(table)) for table in block_tables], dtype=torch.int32)
        self._check_tables(tables, block_tables)
        sample_items = [i for i, item in enumerate(batch) if item.sample]
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(dev),
            query_start_loc=torch.arange(len(batch) + 1, dtype=torch.int32).to(dev),
            seq_lens=torch.tensor(positions, dtype=torch.int32).add_(1).to(dev),
            block_tables=tables.to(dev),
            max_query_len=1,
            max_seq_len=max(positions) + 1,
        )
        return StepInputs(
            input_ids=torch.tensor(token_ids, dtype=torch.int64).to(dev),
            positions=torch.tensor(positions, dtype=torch.int64).to(dev),
            meta=meta,
            sample_items=sample_items,
            sample_token_index=torch.tensor(sample_items, dtype=torch.int64).to(dev),
        )

    def _prepare_general(self, batch: list[ScheduledSeq]) -> StepInputs:
        bs = self.block_size
        token_ids: list[int] = []
        starts, q_lens, block_tables = [], [], []
        for item in batch:
            seq, start, n = item.seq, item.seq.num_computed_tokens, item.num_new_tokens
            end = start + n
            num_blocks = self._check_item(seq, start, end)
            token_ids += seq.token_ids[start:end]
            starts.append(start)
            q_lens.append(n)
            block_tables.append(seq.block_table[:num_blocks])
        width = max(len(bt) for bt in block_tables)
        tables = torch.tensor([bt + [0] * (width - len(bt)) for bt in block_tables], dtype=torch.int64)
        self._check_tables(tables, block_tables)
        q_lens_t = torch.tensor(q_lens, dtype=torch.int64)
        starts_t = torch.tensor(starts, dtype=torch.int64)
        query_start_loc = torch.zeros(len(batch) + 1, dtype=torch.int64)
        torch.cumsum(q_lens_t, 0, out=query_start_loc[1:])
        seq_index = torch.repeat_interleave(torch.arange(len(batch)), q_lens_t)
        positions = torch.arange(len(token_ids)) - query_start_loc[seq_index] + starts_t[seq_index]
        slot_mapping = tables[seq_index, positions // bs] * bs + positions % bs
        seq_lens = starts_t + q_lens_t
        sample_items = [i for i, item in enumerate(batch) if item.sample]
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(dev),
            query_start_loc=query_start_loc.to(dev, torch.int32),
            seq_lens=seq_lens.to(dev, torch.int32),
            block_tables=tables.to(dev, torch.int32),
            max_query_len=max(q_lens),
            max_seq_len=int(seq_lens.max()),
        )
        return StepInputs(
            input_ids=torch.tensor(token_ids, dtype=torch.int64).to(dev),
            positions=positions.to(dev),
            meta=meta,
            sample_items=sample_items,
            sample_token_index=(query_start_loc[1:][sample_items] - 1).to(dev),
        )
