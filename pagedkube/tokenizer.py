"""Tokenizer and chat template, as Hugging Face renders them, without torch.

The engine and the gateway both use this class, so a prompt is rendered and
tokenized identically on both sides (docs/design.md "Gateway": the gateway hashes prompts
exactly as the engine does). It reads the standard files of a Hugging Face model
directory: tokenizer.json, tokenizer_config.json (special tokens), the chat template
and generation_config.json (EOS ids), either from a folder or from a dict of file
contents (what GET /v1/cache/tokenizer serves).

The chat template is read where Hugging Face keeps it, first found wins (transformers'
order: a tokenizer prefers chat_template.jinja to tokenizer_config.json, and a processor
reads the legacy chat_template.json when there is no .jinja):

    chat_template.jinja  >  chat_template.json {"chat_template": ...}  >  tokenizer_config.json
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

from tokenizers import Tokenizer as _HFTokenizer

# Texts longer than this are encoded with the GIL released; shorter ones take the
# direct call (encode_batch's hand-off to its thread pool costs more than they do).
RELEASE_GIL_CHARS = 16 * 1024
CHAT_TEMPLATE_JINJA = "chat_template.jinja"     # transformers >= 4.50 saves templates here
CHAT_TEMPLATE_JSON = "chat_template.json"       # processors' legacy file
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json",
                   CHAT_TEMPLATE_JINJA, CHAT_TEMPLATE_JSON)


def chat_template_from(files: Mapping[str, str], config: Mapping[str, Any]) -> str | None:
    """The chat template, by transformers' precedence (the module docstring)."""
    if files.get(CHAT_TEMPLATE_JINJA):
        return files[CHAT_TEMPLATE_JINJA]
    if files.get(CHAT_TEMPLATE_JSON):
        try:
            template = json.loads(files[CHAT_TEMPLATE_JSON]).get("chat_template")
        except (json.JSONDecodeError, AttributeError) as e:
            raise ValueError(f"{CHAT_TEMPLATE_JSON} is not a JSON object with a chat_template: {e}") from None
        if template:
            return template
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: use "default"
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    return template or None


def load_chat_template(given: str) -> str:
    """`--chat-template` as vLLM reads it: a file's path, or the template's own text (anything
    with a brace or a newline). A path that does not open is a ValueError, not a template."""
    path = Path(given).expanduser()
    try:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:       # unreadable, or a "path" too long to be one
        if not any(c in given for c in "{}\n"):
            raise ValueError(f"chat template {given!r}: {e}") from None
    if any(c in given for c in "{}\n"):
        return given
    raise ValueError(f"chat template {given!r} is neither a readable file nor a Jinja template")


def tokenizer_files(model_dir: str | Path) -> dict[str, str]:
    """The TOKENIZER_FILES a model directory has, by name: what Tokenizer(files) reads."""
    model_dir = Path(model_dir)
    return {name: (model_dir / name).read_text(encoding="utf-8")
            for name in TOKENIZER_FILES if (model_dir / name).is_file()}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised as a dict
        return value.get("content")
    return value


class Tokenizer:
    def __init__(self, files: Mapping[str, str]):
        if "tokenizer.json" not in files:
            raise ValueError("model directory has no tokenizer.json (only fast tokenizers are supported)")
        self._tok = _HFTokenizer.from_str(files["tokenizer.json"])
        config = json.loads(files.get("tokenizer_config.json") or "{}")
        gen_config = json.loads(files.get("generation_config.json") or "{}")
        model_config = json.loads(files.get("config.json") or "{}")
        self.files = dict(files)
        self.chat_template: str | None = chat_template_from(files, config)
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.pad_token = _token_text(config.get("pad_token"))
        eos_ids = gen_config.get("eos_token_id", model_config.get("eos_token_id"))
        if eos_ids is None and self.eos_token is not None:
            eos_ids = self._tok.token_to_id(self.eos_token)
        if isinstance(eos_ids, int):
            eos_ids = [eos_ids]
        self.eos_token_ids: list[int] = [i for i in (eos_ids or []) if i is not None]
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._template = None

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "Tokenizer":
        return cls(tokenizer_files(model_dir))

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > RELEASE_GIL_CHARS:
            # tokenizers' encode() holds the GIL throughout; encode_batch_fast() releases
            # it and tracks no offsets (same ids; dropping 2M offsets also takes the GIL).
            # Measured on a 2 MB text: another thread stalled 5.4 s with encode(), at
            # most 0.11 s with this. So a long prompt encoded in a worker thread leaves
            # the event loop free.
            return self._tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render messages with the model's chat template, as transformers'
        apply_chat_template(tokenize=False) does."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; use /v1/completions")
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            pad_token=self.pad_token or "",
            **kwargs,
        )

    def apply_chat_template(self, conversation: list[dict], tools: list[dict] | None = None,
                            add_generation_prompt: bool = False, tokenize: bool = True,
                            **kwargs: Any) -> str | list[int]:
        """transformers' apply_chat_template for one conversation of plain dicts (its defaults:
        no generation prompt, token ids): the text, or its ids without added special tokens."""
        if tools is not None:
            kwargs["tools"] = tools
        text = self.render_chat(conversation, add_generation_prompt, **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
        # The template already carries the special tokens (as transformers does).
        return self.encode(self.render_chat(messages, add_generation_prompt, **kwargs), add_special_tokens=False)


def _compile_template(source: str):
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas.

    Byte-level BPE can split one UTF-8 character over several tokens; while the
    decoded tail is an incomplete character (U+FFFD) it is held back.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.text = ""  # text released so far

    def add(self, token_ids: list[int]) -> str:
        self.token_ids.extend(token_ids)
        full = self.tokenizer.decode(self.token_ids, self.skip_special_tokens)
        if full.endswith("\ufffd"):
            return ""
        delta = full[len(self.text):] if full.startswith(self.text) else ""
        self.text = full if full.startswith(self.text) else self.text
        return delta
