"""Request bodies of the OpenAI-compatible API (pydantic), as vLLM accepts them.

Three kinds of fields (the table is in docs/server.md "Request fields"):
- honoured: OpenAI's sampling fields and vLLM's extensions that are cheap here
  (top_k, min_p, repetition_penalty, min_tokens, stop_token_ids, ignore_eos,
  truncate_prompt_tokens, continue_final_message, echo, cache_salt, ...);
- accepted and ignored: fields that change nothing we compute, or that only
  vLLM/SGLang features read (`user`, `priority`, `include_reasoning`, ...);
- rejected with a 400 naming the field, only when given a value we cannot
  honour (`use_beam_search: true`, `tools`, a JSON response_format, ...).
Fields nobody declared are ignored and reported by `unknown_fields()`; the
server logs one warning per field name, as vLLM does, so routers and SDKs
built for vLLM (which add their own fields) work unchanged (PITFALLS.md).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, Tag

from pagedkube.engine.server.errors import bad_request

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
    no_stop_trim: bool = False                  # SGLang's name for include_stop_str_in_output
    add_special_tokens: bool | None = None      # None: True for completions, False for chat (vLLM's defaults)
    # Accepted at their defaults only (check_supported).
    use_beam_search: bool = False
    prompt_logprobs: int | None = None
    allowed_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None
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
                    "guided_json": (self.guided_json is not None, "guided decoding"),
                    "guided_regex": (self.guided_regex is not None, "guided decoding"),
                    "guided_choice": (self.guided_choice is not None, "guided decoding"),
                    "guided_grammar": (self.guided_grammar is not None, "guided decoding"),
                    "structured_outputs": (bool(self.structured_outputs), "structured outputs"),
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


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    # Accepted and ignored: reasoning text a client sends back (vLLM/SGLang), refusals.
    reasoning_content: str | None = None
    refusal: str | None = None

    def to_template(self) -> dict[str, Any]:
        """The dict a Hugging Face chat template expects (text parts joined, as vLLM does)."""
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                                   "content": content if content is not None else ""}
        if self.name is not None:
            message["name"] = self.name
        return message


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


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
    # Accepted at their defaults only.
    chat_template: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    modalities: list[str] | None = None
    # Accepted and ignored.
    parallel_tool_calls: bool | None = None
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
        if self.tools:
            raise bad_request("tools are not supported by this server", "tools")
        if self.tool_choice not in (None, "none", "auto"):
            raise bad_request("tool_choice is not supported by this server", "tool_choice")
        if self.response_format is not None and self.response_format.type != "text":
            raise bad_request("response_format: only {'type': 'text'} is supported", "response_format")
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


def _tokenize_kind(body: Any) -> str:
    messages = body.get("messages") if isinstance(body, dict) else getattr(body, "messages", None)
    return "Chat" if messages is not None else "Prompt"


# vLLM's two shapes, told apart by `messages` (so errors are about the shape the caller meant).
TokenizeRequest = Annotated[Union[Annotated[TokenizeCompletionRequest, Tag("Prompt")],
                                  Annotated[TokenizeChatRequest, Tag("Chat")]], Discriminator(_tokenize_kind)]


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[TokenId]
