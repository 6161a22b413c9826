"""Chained block hashes for the prefix cache, shared by the engine and the gateway.

Block i of a prompt (only full blocks are hashed) is keyed by

    h_i = sha256( h_{i-1} || u32le(len(tokens_i)) || u32le(tokens_i...) || u32le(len(extra_i)) || extra_i )

with h_{-1} = sha256("pagedkube-root\\0" || seed). `extra_0` carries the cache salt
(per tenant), so two tenants' chains differ from the first block on; later blocks
inherit the difference through the chain. A LoRA adapter's request carries the
adapter's name in every block's extra (vLLM's "extra keys" do the same), so no
block computed under one adapter, or under the base model, is ever served to another:

    base model     extra_0 = salt                     extra_i = b""
    adapter NAME   extra_i = 0xff "lora" u32le(len(salt_i)) salt_i NAME   (salt_i = salt for i = 0, else b"")

0xff never occurs in UTF-8, so an adapter's extra cannot equal any base salt.

The encoding is canonical (fixed-width
little-endian integers with explicit lengths), so two processes, two machines or a
gateway and an engine always compute the same bytes: no Python `hash()`, no pickle,
no PYTHONHASHSEED (docs/design.md, pitfall "Hash collisions are data leaks", "hash seed mismatches").

This module is torch-free and import-light: the gateway image uses it.
"""
from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from functools import lru_cache
from typing import Iterable, Sequence

HASH_ALGORITHM = "sha256-chain-u32le-v1"
DEFAULT_HASH_SEED = ""

_U32 = struct.Struct("<I")


@lru_cache(maxsize=64)
def root_hash(seed: str = DEFAULT_HASH_SEED) -> bytes:
    """The parent hash of a prompt's first block."""
    return hashlib.sha256(b"pagedkube-root\0" + seed.encode("utf-8")).digest()


_U32_TYPECODE = "I" if array("I").itemsize == 4 else "L"


def _u32_array(token_ids: Sequence[int]) -> bytes:
    arr = array(_U32_TYPECODE, token_ids)  # raises OverflowError for negatives / > 2**32-1
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def hash_block(parent: bytes, token_ids: Sequence[int], extra: bytes = b"") -> bytes:
    """Hash of one block given its parent's hash, its token ids and extra keys."""
    return _hash_packed(parent, len(token_ids), _u32_array(token_ids), extra)


def _hash_packed(parent: bytes, num_tokens: int, packed_tokens: bytes, extra: bytes) -> bytes:
    """The one encoding of a block (module docstring), its tokens already packed."""
    return hashlib.sha256(b"".join((parent, _U32.pack(num_tokens), packed_tokens,
                                    _U32.pack(len(extra)), extra))).digest()


def salt_bytes(cache_salt: str | None) -> bytes:
    return b"" if not cache_salt else cache_salt.encode("utf-8")


_LORA_TAG = b"\xfflora"


def extra_keys(block_index: int, cache_salt: str | None = None, lora_name: str | None = None) -> bytes:
    """The `extra` of block `block_index` of a request (module docstring)."""
    salt = salt_bytes(cache_salt) if block_index == 0 else b""
    if lora_name is None:
        return salt
    return b"".join((_LORA_TAG, _U32.pack(len(salt)), salt, lora_name.encode("utf-8")))


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    seed: str = DEFAULT_HASH_SEED,
    cache_salt: str | None = None,
    parent: bytes | None = None,
    start_block: int = 0,
    lora_name: str | None = None,
) -> list[bytes]:
    """Hashes of every full block of `token_ids`.

    `parent`/`start_block` continue an existing chain: pass the hash of block
    `start_block - 1` to hash only the blocks after it (the engine extends a
    running request's chain this way as its output fills blocks). `lora_name`: the
    adapter the request runs under (None: the base model).
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    num_full = len(token_ids) // block_size
    if start_block == 0:
        parent = root_hash(seed)
    elif parent is None:
        raise ValueError("parent is required when start_block > 0")
    # hash_block per block, with the prompt's tokens packed once.
    data = _u32_array(token_ids[start_block * block_size:num_full * block_size])
    width = 4 * block_size
    hashes: list[bytes] = []
    for j, i in enumerate(range(start_block, num_full)):
        extra = extra_keys(i, cache_salt, lora_name)
        parent = _hash_packed(parent, block_size, data[j * width:(j + 1) * width], extra)
        hashes.append(parent)
    return hashes


def to_hex(hashes: Iterable[bytes]) -> list[str]:
    return [h.hex() for h in hashes]


def cache_config(block_size: int, seed: str = DEFAULT_HASH_SEED) -> dict:
    """The body of GET /v1/cache/config: what a router needs to hash as we do."""
    return {"block_size": block_size, "hash_algorithm": HASH_ALGORITHM, "hash_seed": seed}
