"""Tokenization with a cache of the text between added tokens.

Hugging Face's fast tokenizers first cut the text at its added tokens
(`<|im_start|>`, `<|im_end|>`, ...) and then normalize, pre-tokenize and
encode every piece in between on its own. So the ids of a rendered chat are
the ids of its pieces with the added tokens' ids between them, and a piece
that was seen before (a system prompt, a profile, every earlier turn of a
conversation) need not be encoded again. A multi-turn request re-sends its
whole history each turn; with this cache only the new message is encoded.

`CachedEncoder.encode(text)` equals `tokenizer.encode(text, add_special_tokens=False)`
id for id. It uses the cache only where that holds by construction, and checks
it on sample texts when it is built; otherwise (`exact` is False) every call
goes to the tokenizer. Not covered, so never cached:
  * added tokens that strip whitespace (`lstrip` / `rstrip`), match single
    words, or are matched after normalization;
  * a Metaspace pre-tokenizer that prepends "▁" only to the first piece of the
    text (`prepend_scheme: first`), since a piece does not know where it was;
  * `add_special_tokens=True` with a post-processor that adds ids (Llama 3's
    BOS template): those calls go to the tokenizer. Chats are rendered with
    their special tokens in the text and encoded without, so they still use the
    cache.
"""
from __future__ import annotations

import json
import re
from array import array
from collections import OrderedDict
from typing import Any

from pagedkube.tokenizer import Tokenizer

DEFAULT_MAX_CHARS = 8 << 20  # text kept in the cache (pieces, total characters)
# Ids are kept as 4-byte arrays: with about 4 characters a token, a full cache holds
# 8 Mi characters of text plus ~8 MiB of ids (lists of Python ints would take ~9x that).
_MIN_PIECE = 1  # every piece is cached: a dict lookup costs less than a call into the tokenizer

_SAMPLES = (
    "hello world",
    "  leading spaces\n\nand lines\r\n",
    "naïve café – 東京 🐶 ",
    "tail space ",
    "",
)


def _exact_by_construction(tokenizer_json: dict) -> bool:
    for token in tokenizer_json.get("added_tokens") or []:
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word") or token.get("normalized"):
            return False
    parts = json.dumps([tokenizer_json.get("normalizer"), tokenizer_json.get("pre_tokenizer")])
    return not ("Metaspace" in parts and '"first"' in parts)


def _adds_ids(tokenizer_json: dict) -> bool:
    """Whether the post-processor may add ids when add_special_tokens=True."""
    processor = tokenizer_json.get("post_processor")
    return processor is not None and processor.get("type") != "ByteLevel"


class CachedEncoder:
    """`encode` / `encode_chat` of a Tokenizer, with a bounded LRU of pieces.
    Not thread-safe: one per event loop (the gateway's, the server's)."""

    def __init__(self, tokenizer: Tokenizer, max_chars: int = DEFAULT_MAX_CHARS):
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, got {max_chars}")
        self.tokenizer = tokenizer
        self.max_chars = max_chars
        self._pieces: OrderedDict[str, array] = OrderedDict()
        self._chars = 0
        spec = json.loads(tokenizer.files["tokenizer.json"])
        added = {t["content"]: t["id"] for t in spec.get("added_tokens") or [] if t.get("content")}
        self._added = added
        # Leftmost match, longest first at a position: what the tokenizer's splitter does.
        self._split = re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))) \
            if added else None
        self._special_direct = _adds_ids(spec)
        self.exact = max_chars > 0 and _exact_by_construction(spec) and self._self_check()

    def _self_check(self) -> bool:
        marks = list(self._added)[:3] or [""]
        for sample in _SAMPLES:
            text = marks[0].join([sample, sample, ""]) + "".join(f"{sample}{m}" for m in marks)
            if self._encode_pieces(text) != self.tokenizer.encode(text, add_special_tokens=False):
                return False
        self.clear()
        return True

    def clear(self) -> None:
        self._pieces.clear()
        self._chars = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not self.exact or (add_special_tokens and self._special_direct):
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return self._encode_pieces(text)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
        return self.encode(self.tokenizer.render_chat(messages, add_generation_prompt, **kwargs))

    def _encode_pieces(self, text: str) -> list[int]:
        if self._split is None:
            return list(self._piece(text))
        ids: list[int] = []
        pos = 0
        for match in self._split.finditer(text):
            if match.start() > pos:
                ids += self._piece(text[pos:match.start()])
            ids.append(self._added[match.group()])
            pos = match.end()
        if pos < len(text):
            ids += self._piece(text[pos:])
        return ids

    def _piece(self, piece: str) -> list[int] | array:
        if len(piece) < _MIN_PIECE or len(piece) > self.max_chars:
            return self.tokenizer.encode(piece, add_special_tokens=False)
        ids = self._pieces.get(piece)
        if ids is not None:
            self._pieces.move_to_end(piece)
            return ids
        ids = array("I", self.tokenizer.encode(piece, add_special_tokens=False))
        self._pieces[piece] = ids
        self._chars += len(piece)
        while self._chars > self.max_chars:
            old, _ = self._pieces.popitem(last=False)
            self._chars -= len(old)
        return ids
