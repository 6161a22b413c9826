"""Turns an OpenAI request body into a RoutingInput, hashing as the engine does.

The engine renders chat messages with the model's template, tokenizes, and keys
each full block with pagedkube.hashing.block_hashes (salted with the request's
cache_salt). The gateway does the same with the same tokenizer files (fetched
from an engine's /v1/cache/tokenizer) and the same block size and seed (from
/v1/cache/config), so its hashes equal the ones in the engines' cache feeds.

Ring key (which pod a prompt goes to when no pod holds its prefix): the
chained hash of the first min(m, ring_key_blocks) full blocks of the prompt's
"head", where the head is
  * chat: the conversation up to and including the first user message
    (rendered without the generation prompt), which every later turn of the
    session repeats unchanged;
  * completions: the whole prompt.
So a growing conversation keeps its key on every turn (its pod even before the
cache feed reports its blocks); sessions that share only a short system prompt
differ in their first user message and spread over the ring; and prompts that
share a long head (questions about one document, a long system prompt) share
the key of its first ring_key_blocks blocks (default 16 x 16 = 256 tokens) and
land together. A head shorter than one block is keyed by all its tokens.
When the tokenizer is not there (not fetched yet, or the template fails),
routing falls back to the ring on a hash of the raw text (reason `fallback`),
never to an error.
"""
from __future__ import annotations

import json
from collections import OrderedDict

from pagedkube import hashing
from pagedkube.chat_messages import content_text, template_kwargs, template_messages
from pagedkube.gateway.routing import keys
from pagedkube.gateway.routing.types import RoutingInput
from pagedkube.piece_cache import CachedEncoder
from pagedkube.tokenizer import Tokenizer

DEFAULT_RING_KEY_BLOCKS = keys.DEFAULT_RING_KEY_BLOCKS
_FALLBACK_CHARS = 1024  # raw-text key: the first 1 KiB, stable as a prompt grows
DEFAULT_HEAD_CACHE = 4096  # heads (conversation up to the first user message) whose tokens are kept
_TOKEN_ID_END = 1 << 32    # block hashes encode ids as u32 (pagedkube/hashing.py)
# Head ids from a text prefix (PromptHasher._encode_head): 64 Ki characters, or 16 per
# token of the key where that is more (English runs ~4 characters a token), used when
# it yields the key's tokens plus 64 more (no word near the cut reaches the key).
_HEAD_PREFIX_CHARS = 64 * 1024
_CHARS_PER_TOKEN_BOUND = 16
_HEAD_MARGIN_TOKENS = 64


def raw_text(kind: str, body: dict) -> str:
    """The prompt's text without a tokenizer (fallback key): for chat, the turns
    up to the first user message, so it is stable across a session's turns."""
    if kind == "chat":
        lines = []
        for m in body.get("messages") or []:
            if not isinstance(m, dict):
                continue
            lines.append(f"{m.get('role')}: {content_text(m.get('content'))}")
            if m.get("role") == "user":
                break
        return "\n".join(lines)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


class PromptHasher:
    """Pure: holds the tokenizer and cache config, no I/O. Every turn of a
    session re-sends its history; the tokenizer's pieces between added tokens
    (each message, in a chat template) are cached (pagedkube.piece_cache), so
    a turn encodes only its new text, and the head's token ids are kept in a
    bounded LRU (one template render less per request after a session's first)."""

    def __init__(self, tokenizer: Tokenizer | None, block_size: int = 16, seed: str = hashing.DEFAULT_HASH_SEED,
                 ring_key_blocks: int = DEFAULT_RING_KEY_BLOCKS, head_cache: int = DEFAULT_HEAD_CACHE):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if ring_key_blocks <= 0:
            raise ValueError(f"ring_key_blocks must be positive, got {ring_key_blocks}")
        self.tokenizer = tokenizer
        self.encoder = CachedEncoder(tokenizer) if tokenizer is not None else None
        self.block_size = block_size
        self.seed = seed
        self.ring_key_blocks = ring_key_blocks
        self.head_cache = head_cache
        self._heads: OrderedDict[tuple, list[int]] = OrderedDict()

    def fallback(self, kind: str, body: dict, cache_salt: str | None, lora_name: str | None = None) -> RoutingInput:
        text = raw_text(kind, body)[:_FALLBACK_CHARS]
        return RoutingInput(ring_key=keys.digest(b"raw", cache_salt, text.encode()), block_size=self.block_size,
                            tokenized=False, lora_name=lora_name)

    def routing_input(self, kind: str, body: dict, cache_salt: str | None, cached: bool = True,
                      lora_name: str | None = None) -> RoutingInput:
        """`lora_name`: the LoRA adapter the body's model names (None: a base model).
        `cached=False` skips the piece and head caches and so touches no shared
        state: that call may run in a worker thread while the event loop runs
        cached ones (the Rust tokenizer and a compiled jinja template are safe
        to share between threads; the caches are not)."""
        if self.tokenizer is None:
            return self.fallback(kind, body, cache_salt, lora_name)
        try:
            token_ids, key_ids = self._tokenize(kind, body, cached)
        except Exception:  # noqa: BLE001  a template or tokenizer error routes, it does not fail the request
            return self.fallback(kind, body, cache_salt, lora_name)
        if not token_ids:
            return self.fallback(kind, body, cache_salt, lora_name)
        return keys.routing_input(token_ids, key_ids, block_size=self.block_size, seed=self.seed,
                                  ring_key_blocks=self.ring_key_blocks, cache_salt=cache_salt, lora_name=lora_name)

    def _tokenize(self, kind: str, body: dict, cached: bool) -> tuple[list[int], list[int] | None]:
        tok = self.encoder if cached else self.tokenizer
        assert tok is not None
        if kind == "chat":
            messages = template_messages(body["messages"])
            kwargs = template_kwargs(body)     # chat_template_kwargs and tools, as the engine renders them
            add_generation_prompt = body.get("add_generation_prompt", True)
            token_ids = tok.encode_chat(messages, add_generation_prompt=add_generation_prompt, **kwargs)
            first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), len(messages) - 1)
            head = messages[:first_user + 1]
            # Rendered without the generation prompt, so turn 1 and turn 5 agree.
            return token_ids, self._head_ids(head, kwargs, cached)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]  # a batch of prompts routes by its first
        if isinstance(prompt, str):
            return tok.encode(prompt, add_special_tokens=body.get("add_special_tokens", True) is not False), None
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < _TOKEN_ID_END
                                            for t in prompt):
            return list(prompt), None
        return [], None   # not a prompt the hashes can encode (the engine answers it 400): the ring on raw text

    def _head_ids(self, head: list[dict], kwargs: dict, cached: bool = True) -> list[int]:
        if not cached:
            return self._encode_head(self.tokenizer, head, kwargs)
        # The strings themselves, not a JSON dump of the messages: this runs on every request.
        key = (tuple((m["role"], m["content"], m.get("name"), m.get("tool_call_id"),
                      json.dumps(m["tool_calls"], sort_keys=True, default=str) if "tool_calls" in m else None)
                     for m in head),
               json.dumps(kwargs, sort_keys=True, default=str) if kwargs else "")
        ids = self._heads.get(key)
        if ids is not None:
            self._heads.move_to_end(key)
            return ids
        ids = self._encode_head(self.encoder, head, kwargs)
        if self.head_cache > 0:
            self._heads[key] = ids
            if len(self._heads) > self.head_cache:
                self._heads.popitem(last=False)
        return ids

    def _encode_head(self, tok: CachedEncoder | Tokenizer | None, head: list[dict], kwargs: dict) -> list[int]:
        """The head's first ring_key_blocks blocks of ids are all the key needs. A long
        head (a first message of megabytes) is encoded from a prefix of its text long
        enough to give those ids and a margin: BPE cuts text into words first, so ids
        far from the cut do not depend on where it falls. Either way the same head
        gives the same ids, whichever path (cached or not) encodes it."""
        assert tok is not None
        text = tok.tokenizer.render_chat(head, False, **kwargs) if isinstance(tok, CachedEncoder) \
            else tok.render_chat(head, False, **kwargs)
        needed = self.ring_key_blocks * self.block_size
        prefix = max(_HEAD_PREFIX_CHARS, needed * _CHARS_PER_TOKEN_BOUND)
        if len(text) > prefix:
            ids = tok.encode(text[:prefix], add_special_tokens=False)
            if len(ids) >= needed + _HEAD_MARGIN_TOKENS:
                return ids[:needed]
        return tok.encode(text, add_special_tokens=False)


class CurrentHasher:
    """The PromptHasher requests use now, shared by the request path (reads `hasher`)
    and the engine watcher (swaps in a new one when the engines' cache config or
    tokenizer arrive). A hasher is replaced, never changed in place: a large prompt
    may be hashing in the tokenize pool with the old one meanwhile."""

    def __init__(self, ring_key_blocks: int = DEFAULT_RING_KEY_BLOCKS):
        self.hasher = PromptHasher(None, ring_key_blocks=ring_key_blocks)
