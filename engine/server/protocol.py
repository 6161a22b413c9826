"""Request bodies of the OpenAI-compatible API (pydantic, `extra="forbid"`).

Unknown fields get a 400 naming the field (OpenAI's "Unrecognized request
argument supplied"). OpenAI fields the official client may send are declared:
those we honour map onto SamplingParams; those that change nothing here (`user`,
`metadata`, `store`, ...) are accepted and ignored; those whose non-default
values we cannot honour (penalties, logit_bias, tools, json mode, ...) are
accepted at their default and rejected otherwise by `check_supported()`.
vLLM's extra sampling fields (top_k, min_p, stop_token_ids, ignore_eos,
cache_salt, ...) are accepted as top-level fields (the client's `extra_body`).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from pagedkube.engine.server.errors import bad_request

# Bounds: seeds are int64 (what torch generators accept, as vLLM bounds them);
# n and logprobs are capped so one request cannot ask for unbounded work.
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
MAX_N = 64
MAX_LOGPROBS = 20
MAX_PROMPTS = 64                 # prompts in one /v1/completions batch
MAX_STOP = 16                    # stop strings per request

Finite = Annotated[float, Field(allow_inf_nan=False)]
TokenId = Annotated[int, Field(ge=0, le=2 ** 31 - 1)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Accepted at their defaults only (check_supported).
    presence_penalty: Finite | None = Field(None, ge=-2, le=2)
    frequency_penalty: Finite | None = Field(None, ge=-2, le=2)
    repetition_penalty: Finite | None = Field(None, gt=0)
    logit_bias: dict[str, Finite] | None = None
    # Accepted and ignored: they change nothing about the answer.
    user: str | None = None

    def check_supported(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0):
                raise bad_request(f"{name} is not supported by this server (only 0)", name)
        if self.repetition_penalty not in (None, 1):
            raise bad_request("repetition_penalty is not supported by this server (only 1)", "repetition_penalty")
        if self.logit_bias:
            raise bad_request("logit_bias is not supported by this server", "logit_bias")
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stops) > MAX_STOP:
            raise bad_request(f"stop: at most {MAX_STOP} stop strings", "stop")
        if any(not s for s in stops):
            raise bad_request("stop: stop strings must be non-empty", "stop")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")

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
    add_special_tokens: bool = True
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
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # Accepted at their defaults only.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    modalities: list[str] | None = None
    # Accepted and ignored.
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
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
