"""Request bodies of the OpenAI-compatible API (pydantic), as vLLM accepts them.

Three kinds of fields (the table is in docs/server.md "Request fields"):
- honoured: OpenAI's sampling fields and vLLM's extensions that are cheap here
  (top_k, min_p, repetition_penalty, min_tokens, stop_token_ids, ignore_eos,
  truncate_prompt_tokens, continue_final_message, echo, cache_salt, ...);
- accepted and ignored: fields that change nothing we compute, or that only
  vLLM/SGLang features read (`user`, `priority`, `include_reasoning`, ...);
- rejected with a 400 naming the field, only when given a value we cannot
  honour (`use_beam_search: true`, `prompt_logprobs`, ...).
Structured outputs (response_format, structured_outputs, guided_*) become one
constraint in constraints.py; tools and tool_choice are described in tools.py.
Fields nobody declared are ignored and reported by `unknown_fields()`; the
server logs one warning per field name, as vLLM does, so routers and SDKs
built for vLLM (which add their own fields) work unchanged (docs/design.md "Pitfalls").
"""
from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, Tag, ValidationError, field_validator

from pagedkube.chat_messages import template_kwargs as _chat_template_kwargs
from pagedkube.chat_messages import template_message
from pagedkube.engine.server.errors import bad_request
from pagedkube.engine.server.tools import ToolCall, ToolChoice, ToolDefinition, check_tools

# Bounds: seeds are int64 (what torch generators accept, as vLLM bounds them);
# n and logprobs are capped so one request cannot ask for unbounded work.
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
MAX_N = 64
MAX_LOGPROBS = 20
MAX_PROMPTS = 64                 # prompts in one /v1/completions batch
MAX_STOP = 16                    # stop strings per request

Finite = Annotated[float, Field(allow_inf_nan=False)]
TokenId = Annotated[int, Field(ge=0, le=2 ** 31 - 1, strict=True)]   # strict: `true` is not token 1


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    def unknown_fields(self, prefix: str = "") -> list[str]:
        """Dotted names of the fields nobody declared, here and in nested bodies."""
        names = [prefix + name for name in (self.model_extra or {})]
        for name in type(self).model_fields:
            value = getattr(self, name, None)
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, _Body):
                    names += item.unknown_fields(f"{prefix}{name}.")
        return sorted(set(names))


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False          # vLLM: usage on every chunk


class JSONSchemaFormat(_Body):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class StructuredOutputsBody(_Body):
    """vLLM's `structured_outputs` request field (one of json, regex, choice, grammar, json_object)."""
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    json_schema: Any = Field(None, alias="json")   # `json` itself would shadow BaseModel.json
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: Any = None                  # rejected (constraints.py)
    disable_any_whitespace: bool = False
    # Accepted and ignored: they tune other backends (outlines, guidance) or fallbacks we do not have.
    disable_fallback: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


class _SamplingFields(_Body):
    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: Finite | None = Field(None, ge=0)
    top_p: Finite | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: Finite | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    stream: StrictBool | None = False   # "yes" is refused, as the gateway refuses it (null: false)
    stream_options: StreamOptions | None = None
    # Accepted at their defaults only (check_supported).
    presence_penalty: Finite | None = Field(None, ge=-2, le=2)
    frequency_penalty: Finite | None = Field(None, ge=-2, le=2)
    repetition_penalty: Finite | None = Field(None, gt=0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]] | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)   # keep the last k prompt tokens (-1: max_model_len)
    # Structured outputs (constraints.py): OpenAI's, vLLM's, and vLLM's older guided_* names.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsBody | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    no_stop_trim: bool = False                  # SGLang's name for include_stop_str_in_output
    add_special_tokens: bool | None = None      # None: True for completions, False for chat (vLLM's defaults)
    # Accepted at their defaults only (check_supported).
    use_beam_search: bool = False
    prompt_logprobs: int | None = None
    allowed_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    logits_processors: list[Any] | None = None
    return_tokens_as_token_ids: bool | None = None
    # Accepted and ignored: they change nothing about the answer here.
    user: str | None = None
    spaces_between_special_tokens: bool = True  # the fast tokenizers' decode has no such switch
    length_penalty: Finite | None = None        # beam search only
    priority: int | None = None
    request_id: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    return_token_ids: bool | None = None
    return_hidden_states: bool | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None

    def check_supported(self) -> None:
        rejected = {"use_beam_search": (self.use_beam_search, "beam search"),
                    "prompt_logprobs": (self.prompt_logprobs is not None, "prompt logprobs"),
                    "allowed_token_ids": (self.allowed_token_ids is not None, "allowed_token_ids"),
                    "bad_words": (bool(self.bad_words), "bad_words"),
                    "logits_processors": (bool(self.logits_processors), "custom logits processors"),
                    "return_tokens_as_token_ids": (bool(self.return_tokens_as_token_ids),
                                                   "return_tokens_as_token_ids")}
        for name, (given, what) in rejected.items():
            if given:
                raise bad_request(f"{name}: {what} is not supported by this server", name)
        for key in self.logit_bias or {}:
            if not key.lstrip("-").isdigit() or int(key) < 0:
                raise bad_request(f"logit_bias: keys must be token ids, got {key!r}", "logit_bias")
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stops) > MAX_STOP:
            raise bad_request(f"stop: at most {MAX_STOP} stop strings", "stop")
        if any(not s for s in stops):
            raise bad_request("stop: stop strings must be non-empty", "stop")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")

    @property
    def keep_stop_str(self) -> bool:
        return self.include_stop_str_in_output or self.no_stop_trim

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and (self.stream_options.include_usage
                                             or self.stream_options.continuous_usage_stats))

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(_SamplingFields):
    prompt: Union[str, list[str], list[TokenId], list[list[TokenId]]]
    max_tokens: int | None = Field(16, ge=1)      # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_N)

    def check_supported(self) -> None:
        super().check_supported()
        if self.suffix:
            raise bad_request("suffix is not supported by this server", "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise bad_request("best_of must equal n (or be omitted) on this server", "best_of")
        if self.echo and self.logprobs is not None:
            raise bad_request("echo with logprobs (prompt logprobs) is not supported", "echo")

    def prompts(self) -> list[str | list[int]]:
        """The batch as a list of single prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise bad_request("prompt must not be empty", "prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        if len(p) > MAX_PROMPTS:
            raise bad_request(f"prompt: at most {MAX_PROMPTS} prompts per request", "prompt")
        return list(p)


def template_kwargs(chat_template_kwargs: dict[str, Any] | None,
                    tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The template's variables besides messages: chat_template_kwargs, and `tools` as the client
    sent them (pagedkube/chat_messages.py, which the gateway calls with the raw body)."""
    return _chat_template_kwargs({"chat_template_kwargs": chat_template_kwargs, "tools": tools})


def _checked_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """`tools` checked against OpenAI's shape, kept as written (ValueError names the tool)."""
    for i, tool in enumerate(tools or []):
        try:
            ToolDefinition.model_validate(tool)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"[{i}].{where}: {first['msg']}") from None
    return tools


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None    # an assistant's calls, replayed in the history
    tool_call_id: str | None = None             # a tool's answer: the call it answers
    # Accepted and ignored: reasoning text a client sends back (vLLM/SGLang), refusals.
    reasoning_content: str | None = None
    refusal: str | None = None

    def to_template(self) -> dict[str, Any]:
        """The dict a Hugging Face chat template expects (pagedkube/chat_messages.py, which
        the gateway's routing render shares)."""
        return template_message(self.model_dump(exclude_unset=True))


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)               # deprecated by OpenAI, still sent
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool | None = None   # None: True unless continue_final_message
    continue_final_message: bool = False        # the reply continues the last (assistant) message
    echo: bool = False                          # the reply starts with the last message, if it is the assistant's
    chat_template_kwargs: dict[str, Any] | None = None
    # The tools as the client wrote them (their key order is what the template renders, here and
    # in the gateway's routing render); checked against ToolDefinition, read through tool_definitions.
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None       # None: "auto" with tools, "none" without (OpenAI's default)
    parallel_tool_calls: bool | None = None     # False: at most one call (enforced for `required`)
    # Accepted at their defaults only.
    chat_template: str | None = None
    modalities: list[str] | None = None
    # Accepted and ignored.
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    include_reasoning: bool | None = None       # vLLM / SGLang reasoning parsers
    separate_reasoning: bool | None = None      # SGLang
    stream_reasoning: bool | None = None        # SGLang
    documents: list[dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.continue_final_message and self.add_generation_prompt:
            raise bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to true",
                              "continue_final_message")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise bad_request("continue_final_message needs the last message to be the assistant's",
                              "continue_final_message")
        if self.chat_template is not None:
            raise bad_request("chat_template: a per-request chat template is not supported by this server",
                              "chat_template")
        check_tools(self.tool_definitions, self.tool_choice)
        if self.modalities not in (None, ["text"]):
            raise bad_request("modalities: only ['text'] is supported", "modalities")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")

    @property
    def generation_prompt(self) -> bool:
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        return self.add_generation_prompt

    @property
    def requested_max_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.to_template() for m in self.messages]

    def template_kwargs(self) -> dict[str, Any]:
        return template_kwargs(self.chat_template_kwargs, self.tools)

    _check_tools = field_validator("tools")(lambda cls, v: _checked_tools(v))

    @functools.cached_property
    def tool_definitions(self) -> list[ToolDefinition] | None:
        return None if self.tools is None else [ToolDefinition.model_validate(t) for t in self.tools]

    @property
    def effective_tool_choice(self) -> ToolChoice:
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"


class TokenizeCompletionRequest(_Body):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_Body):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None

    _check_tools = field_validator("tools")(lambda cls, v: _checked_tools(v))

    def template_kwargs(self) -> dict[str, Any]:
        return template_kwargs(self.chat_template_kwargs, self.tools)


def _tokenize_kind(body: Any) -> str:
    messages = body.get("messages") if isinstance(body, dict) else getattr(body, "messages", None)
    return "Chat" if messages is not None else "Prompt"


# vLLM's two shapes, told apart by `messages` (so errors are about the shape the caller meant).
TokenizeRequest = Annotated[Union[Annotated[TokenizeCompletionRequest, Tag("Prompt")],
                                  Annotated[TokenizeChatRequest, Tag("Chat")]], Discriminator(_tokenize_kind)]


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[TokenId]
