"""`LLM`: the offline API (docs/design.md "Engine"), shaped like vLLM's.

    llm = LLM()                                   # smollm2-135m-instruct (GGUF) on CPU
    llm = LLM("builtin://tiny")                   # the 4 MB toy, for fast tests
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8))
    outs[0].outputs[0].text
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Sequence, cast

from pagedkube.engine.config import EngineConfig
from pagedkube.engine.llm_engine import LLMEngine
from pagedkube.engine.lora.request import LoRARequest
from pagedkube.engine.outputs import OutputAccumulator, RequestOutput
from pagedkube.engine.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, device: str = "auto", dtype: str = "auto",
                 block_size: int = 16, num_kv_blocks: int | None = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048, max_model_len: int | None = None,
                 enable_prefix_caching: bool = True, seed: int = 0, quantization: str = "auto", **kwargs: Any):
        config = EngineConfig(model=model, device=device, dtype=dtype, block_size=block_size,
                              num_kv_blocks=num_kv_blocks, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                              enable_prefix_caching=enable_prefix_caching, seed=seed, quantization=quantization,
                              **kwargs)
        self.engine = LLMEngine(config)
        self._num_requests = 0

    def get_tokenizer(self):
        return self.engine.tokenizer

    def _decode_token(self) -> Callable[[int], str] | None:
        """A token id's text, for Logprob.decoded_token (special tokens kept, as vLLM shows them)."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            return None
        return lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False)

    def chat(self, messages: Sequence[dict] | Sequence[Sequence[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             chat_template_kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True,
             tools: list[dict] | None = None, use_tqdm: bool = True,
             cache_salt: str | None = None) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of OpenAI-style messages) or a list of them,
        rendered with the model's chat template as the server renders them
        (pagedkube/chat_messages.py), then generated; `.prompt` of each output is the rendered text."""
        from pagedkube.chat_messages import template_kwargs, template_messages

        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError(f"model {self.engine.model_name!r} has no tokenizer.json: chat needs one")
        conversations = cast("list[Sequence[dict]]", [messages] if messages and isinstance(messages[0], dict)
                             else list(messages))
        kwargs = template_kwargs({"chat_template_kwargs": chat_template_kwargs, "tools": tools})
        texts = [tokenizer.render_chat(template_messages(list(c)), add_generation_prompt, **kwargs)
                 for c in conversations]
        outputs = self.generate([tokenizer.encode(t, add_special_tokens=False) for t in texts], sampling_params,
                                cache_salt=cache_salt, use_tqdm=use_tqdm)
        for text, out in zip(texts, outputs):
            out.prompt = text
        return outputs

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, cache_salt: str | None = None, use_tqdm: bool = True,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in input order.

        Prompts: one string, a list of strings, one list of token ids or a list of
        them. Every prompt is validated before any runs, so a bad one raises
        ValueError and nothing was queued. `use_tqdm`: a progress bar of finished
        prompts on a terminal (vLLM's default; never in logs or pipes). `lora_request`:
        the adapter of every prompt, or a list with one per prompt (None: the base model),
        as in vLLM; needs LLM(..., enable_lora=True).
        """
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                              and all(isinstance(t, int) for t in prompts))
        prompts = cast("list[Prompt]", [prompts] if single else list(prompts))
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        if lora_request is None or isinstance(lora_request, LoRARequest):
            loras = [lora_request] * len(prompts)
        else:
            loras = list(lora_request)
            if len(loras) != len(prompts):
                raise ValueError(f"got {len(loras)} lora_requests for {len(prompts)} prompts")
        for i, (prompt, p, lora) in enumerate(zip(prompts, params, loras)):
            try:
                self.engine.check_request(prompt, p, lora)
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        results: dict[str, OutputAccumulator] = {}
        for prompt, p, lora in zip(prompts, params, loras):
            request_id = f"llm-{self._num_requests}"
            self._num_requests += 1
            token_ids = self.engine.add_request(request_id, prompt, p, cache_salt=cache_salt, lora_request=lora)
            results[request_id] = OutputAccumulator(request_id, prompt if isinstance(prompt, str) else None,
                                                    token_ids, self._decode_token())
        return self._run(results, _progress(len(results), use_tqdm))

    def _run(self, results: dict[str, OutputAccumulator], progress: Any = None) -> list[RequestOutput]:
        pending = set(results)
        try:
            while pending:
                for delta in self.engine.step_deltas():
                    if delta.error is not None and delta.request_id in pending:
                        pending.discard(delta.request_id)
                        raise ValueError(f"request {delta.request_id}: {delta.error}")
                    if delta.request_id in pending:
                        results[delta.request_id].add(delta)
                        if delta.finished:
                            pending.discard(delta.request_id)
                            if progress is not None:
                                progress.update(1)
        except BaseException:
            for request_id in pending:   # leave the engine clean for the next call
                self.engine.abort_request(request_id)
            raise
        finally:
            if progress is not None:
                progress.close()
        return [acc.result() for acc in results.values()]


def _progress(total: int, use_tqdm: bool) -> Any:
    """A tqdm bar on a terminal (None otherwise, or without tqdm)."""
    if not use_tqdm or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Processed prompts", unit="prompt")
