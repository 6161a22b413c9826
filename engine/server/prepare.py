"""From a validated request body to what the engine runs: Prepared.

`prepare_*` tokenize, check lengths, read the output constraint and build
SamplingParams (every problem is a 400 naming the field, before anything reaches
the engine); `prepare` runs them inline for ordinary prompts and in a bounded
worker pool for huge ones, so a multi-megabyte prompt never stalls the event loop
(/health, running streams). The request's lifetime in the engine is
generation.py's.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Any

from pagedkube.engine.admission import AdmissionError, AdmissionLimits, allowed_max_tokens
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.server import constraints
from pagedkube.engine.server.errors import APIError, bad_request
from pagedkube.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from pagedkube.engine.server.state import ServerState
from pagedkube.engine.server.tool_parsers import NamedParser, RequiredParser, ToolParser
from pagedkube.engine.structured.params import StructuredOutputsParams
from pagedkube.tokenizer import RELEASE_GIL_CHARS

logger = logging.getLogger("pagedkube.serve")

# vLLM treats temperatures below this as greedy (dividing logits by ~0 overflows).
MIN_TEMPERATURE = 1e-5
# Prompts up to this many characters are tokenized on the event loop (about a
# millisecond); longer ones in the worker pool. The same threshold as the tokenizer's:
# above it Tokenizer.encode lets go of the GIL, which is what makes a worker help.
INLINE_PREPARE_CHARS = RELEASE_GIL_CHARS


@dataclass
class Prepared:
    prompt_ids: list[list[int]]
    prompt_texts: list[str]
    params: SamplingParams
    cache_salt: str | None
    constraint_field: str | None = None     # the request field params.structured_outputs came from

    @property
    def num_seqs(self) -> int:
        return len(self.prompt_ids) * self.params.n


def limits(state: ServerState) -> AdmissionLimits:
    info = state.info
    return AdmissionLimits(info.max_model_len, info.num_kv_blocks, info.block_size)


def _max_tokens(state: ServerState, num_prompt_tokens: int, requested: int | None,
                field: str, prompt_field: str) -> int:
    try:
        return allowed_max_tokens(limits(state), num_prompt_tokens, requested,
                                  prompt_field=prompt_field, tokens_field=field)
    except AdmissionError as exc:
        raise bad_request(str(exc), exc.param) from None


def _check_request_size(state: ServerState, prepared: Prepared, prompt_field: str) -> None:
    """Per-request caps (docs/design.md, pitfall "Admission in the wrong unit"): sequences, and optionally tokens."""
    config = state.config
    max_seqs = config.engine.max_num_seqs
    if prepared.num_seqs > max_seqs:
        raise bad_request(f"this request asks for {prepared.num_seqs} sequences ({len(prepared.prompt_ids)} "
                          f"prompts x n={prepared.params.n}); at most max_num_seqs ({max_seqs}) per request", "n")
    if config.max_request_tokens is not None:
        max_tokens = prepared.params.max_tokens or 0    # always set by _max_tokens here
        total = sum(len(ids) + prepared.params.n * max_tokens for ids in prepared.prompt_ids)
        if total > config.max_request_tokens:
            raise bad_request(f"this request asks for {total} tokens (prompt tokens + n x max_tokens, over all "
                              f"prompts); at most {config.max_request_tokens} per request", prompt_field)


def _sampling_params(state: ServerState, req: CompletionRequest | ChatCompletionRequest,
                     max_tokens: int, logprobs: int | None,
                     constraint: StructuredOutputsParams | None = None,
                     skip_special_tokens: bool | None = None) -> SamplingParams:
    defaults = state.sampling_defaults
    temperature = _given(req.temperature, defaults.get("temperature"), 1.0)
    if temperature < MIN_TEMPERATURE:
        temperature = 0.0
    vocab_size = state.info.vocab_size
    top_k = int(_given(req.top_k, defaults.get("top_k"), 0))
    if top_k < 1:
        top_k = 0   # -1 and 0 both mean no top-k
    if top_k > vocab_size:
        top_k = 0  # keeping more tokens than the vocabulary has is no filter at all
    try:
        return SamplingParams(
            n=req.n, temperature=temperature, top_p=_given(req.top_p, defaults.get("top_p"), 1.0),
            top_k=top_k, min_p=_given(req.min_p, defaults.get("min_p"), 0.0), seed=req.seed, stop=req.stop,
            stop_token_ids=req.stop_token_ids, max_tokens=max_tokens, min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos, logprobs=logprobs, include_stop_str_in_output=req.keep_stop_str,
            skip_special_tokens=req.skip_special_tokens if skip_special_tokens is None else skip_special_tokens,
            structured_outputs=constraint,
            repetition_penalty=_given(req.repetition_penalty, defaults.get("repetition_penalty"), 1.0),
            presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0,
            logit_bias=_logit_bias(state, req.logit_bias))
    except ValueError as exc:
        field = str(exc).split(" ", 1)[0]
        raise bad_request(str(exc), field if field in type(req).model_fields else None) from exc


def _given(requested: float | None, model_default: float | int | None, api_default: float) -> float:
    """A sampling field: the request's, else the generation config's (--generation-config), else the API's."""
    if requested is not None:
        return requested
    return api_default if model_default is None else model_default


def _logit_bias(state: ServerState, bias: dict[str, float] | None) -> dict[int, float] | None:
    if not bias:
        return None
    vocab_size = state.info.vocab_size
    bad = next((key for key in bias if int(key) >= vocab_size), None)
    if bad is not None:
        raise bad_request(f"logit_bias: token id {bad} is out of range (vocabulary size {vocab_size})",
                          "logit_bias")
    return {int(key): value for key, value in bias.items()}


def _truncate(state: ServerState, ids: list[int], keep: int | None) -> list[int]:
    """vLLM's truncate_prompt_tokens: keep the last `keep` tokens (-1: max_model_len)."""
    if keep is None:
        return ids
    keep = state.info.max_model_len if keep == -1 else keep
    if keep < 1:
        raise bad_request("truncate_prompt_tokens must be >= 1 or -1", "truncate_prompt_tokens")
    return ids[-keep:]


def _check_token_ids(state: ServerState, ids: list[int], field: str) -> None:
    vocab_size = state.info.vocab_size
    bad = next((t for t in ids if t >= vocab_size), None)
    if bad is not None:
        raise bad_request(f"{field}: token id {bad} is out of range (vocabulary size {vocab_size})", field)


def tokenizer_for(state: ServerState, field: str) -> Any:
    if state.info.tokenizer is None:
        raise bad_request(f"this model has no tokenizer (no tokenizer.json): {field} must be token ids", field)
    return state.info.tokenizer


def prepare_completion(state: ServerState, req: CompletionRequest) -> Prepared:
    tokenizer = state.info.tokenizer
    add_special = True if req.add_special_tokens is None else req.add_special_tokens
    prompt_ids, prompt_texts = [], []
    for prompt in req.prompts():
        if isinstance(prompt, str):
            ids = tokenizer_for(state, "prompt").encode(prompt, add_special_tokens=add_special)
            text = prompt
        else:
            _check_token_ids(state, prompt, "prompt")
            ids = list(prompt)
            text = tokenizer.decode(prompt, skip_special_tokens=False) if req.echo and tokenizer else ""
        if req.truncate_prompt_tokens is not None:
            ids = _truncate(state, ids, req.truncate_prompt_tokens)
            if req.echo and tokenizer is not None:
                text = tokenizer.decode(ids, skip_special_tokens=False)
        prompt_ids.append(ids)
        prompt_texts.append(text)
    # One SamplingParams for the batch: size max_tokens for the longest prompt.
    longest = max(len(ids) for ids in prompt_ids)
    if min(len(ids) for ids in prompt_ids) == 0:
        raise bad_request("prompt must not be empty (it has 0 tokens)", "prompt")
    max_tokens = _max_tokens(state, longest, req.max_tokens, "max_tokens", "prompt")
    constraint, field = _constraint(state, req)
    prepared = Prepared(prompt_ids, prompt_texts, _sampling_params(state, req, max_tokens, req.logprobs, constraint),
                        req.cache_salt, field)
    _check_request_size(state, prepared, "prompt")
    return prepared


def _constraint(state: ServerState, req: CompletionRequest | ChatCompletionRequest) \
        -> tuple[StructuredOutputsParams | None, str | None]:
    """The request's output constraint, parsed (a 400 naming its field if it cannot be honoured)."""
    constraint, field = constraints.request_constraint(req)
    if constraint is not None and field is not None:
        state.constraint_check.check(constraint, field)
    return constraint, field


def render_chat(state: ServerState, messages: list[dict], add_generation_prompt: bool,
                kwargs: dict | None, continue_final_message: bool = False) -> str:
    try:
        text = tokenizer_for(state, "messages").render_chat(messages, add_generation_prompt, **(kwargs or {}))
    except APIError:
        raise
    except Exception as exc:  # a template error is the request's fault
        raise bad_request(f"messages could not be rendered with the chat template: {exc}", "messages") from exc
    if continue_final_message:
        text = _cut_after_final_message(text, messages[-1]["content"])
    return text


def _cut_after_final_message(text: str, final: str) -> str:
    """transformers' continue_final_message: the rendered chat ends with the last
    message's content (templates such as Llama 3.1's strip it, hence the retry)."""
    for needle in (final, final.strip()):
        at = text.rfind(needle) if needle else -1
        if at >= 0:
            return text[:at + len(needle)]
    raise bad_request("continue_final_message: the final message does not appear in the rendered chat",
                      "continue_final_message")


def prepare_chat(state: ServerState, req: ChatCompletionRequest, inline: bool = True) -> Prepared:
    text = render_chat(state, req.template_messages(), req.generation_prompt, req.template_kwargs(),
                       req.continue_final_message)
    if req.add_special_tokens or not inline:
        # The piece cache (CachedEncoder) is the event loop's alone; a worker encodes directly
        # (Tokenizer.encode lets go of the GIL for long texts).
        ids = tokenizer_for(state, "messages").encode(text, add_special_tokens=bool(req.add_special_tokens))
    else:
        ids = state.chat_encoder().encode(text)
    ids = _truncate(state, ids, req.truncate_prompt_tokens)
    requested, field = req.requested_max_tokens
    if requested is None and "max_tokens" in state.sampling_defaults:
        requested = int(state.sampling_defaults["max_tokens"])
    max_tokens = _max_tokens(state, len(ids), requested, field, "messages")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    constraint, constraint_field = _constraint(state, req)
    # Tool-call markers ([TOOL_CALLS], <|python_tag|>) are special tokens the parser must see.
    keep_special = False if tool_output_parser(state, req) is not None and constraint is None else None
    prepared = Prepared([ids], [text], _sampling_params(state, req, max_tokens, logprobs, constraint, keep_special),
                        req.cache_salt, constraint_field)
    _check_request_size(state, prepared, "messages")
    return prepared


def tool_output_parser(state: ServerState, req: ChatCompletionRequest) -> ToolParser | None:
    """How a chat's answer is read for tool calls (tools.py's table); a 400 when tool_choice is
    "auto" and no parser is configured or detected."""
    if not req.tools:
        return None
    choice = req.effective_tool_choice
    if choice == "none":
        return None
    if choice == "required":
        return RequiredParser()
    if choice != "auto":
        return NamedParser(choice.function.name)
    if state.tool_parser is None:
        raise bad_request("tool_choice: \"auto\" needs a tool-call parser: this model's chat template shows no "
                          "known tool-call format; start the server with --tool-call-parser "
                          "hermes|llama3_json|mistral, or send tool_choice \"required\", a named function or \"none\"",
                          "tool_choice")
    return state.tool_parser


def _constraint_size(req: CompletionRequest | ChatCompletionRequest) -> int:
    """A rough size of what parsing the request's constraint reads (big schemas parse off the loop)."""
    fields = (req.response_format, req.structured_outputs, req.guided_json, req.guided_regex, req.guided_grammar,
              req.guided_choice, getattr(req, "tools", None))
    return sum(len(repr(f)) for f in fields if f is not None)


def _text_size(req: CompletionRequest | ChatCompletionRequest) -> int:
    if isinstance(req, ChatCompletionRequest):
        return sum(len(m.to_template()["content"]) for m in req.messages)
    prompt = req.prompt
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(p) for p in prompt if isinstance(p, str))


async def prepare(state: ServerState, req: CompletionRequest | ChatCompletionRequest) -> Prepared:
    """prepare_completion / prepare_chat inline for ordinary prompts; for a huge one in the
    server's worker pool (bounded: its few threads queue the rest), so the event loop keeps serving."""
    size = _text_size(req) + _constraint_size(req)
    if size <= INLINE_PREPARE_CHARS:
        return prepare_chat(state, req) if isinstance(req, ChatCompletionRequest) else prepare_completion(state, req)
    logger.info("a prompt of %d characters: tokenizing it in a worker thread", size)
    work: functools.partial[Prepared] = (functools.partial(prepare_chat, state, req, inline=False)
                                         if isinstance(req, ChatCompletionRequest)
                                         else functools.partial(prepare_completion, state, req))
    return await asyncio.get_running_loop().run_in_executor(state.workers, work)
