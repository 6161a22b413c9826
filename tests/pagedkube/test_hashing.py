"""pagedkube.hashing: the chained block-hash encoding of its docstring, computed
here independently, byte for byte (the engine and the gateway must agree)."""
import hashlib
import random
import struct

import pytest

from pagedkube import hashing


def spec_hashes(tokens: list[int], block_size: int, seed: str = "", salt: str | None = None) -> list[bytes]:
    parent = hashlib.sha256(b"pagedkube-root\0" + seed.encode()).digest()
    out = []
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size:(i + 1) * block_size]
        extra = (salt or "").encode() if i == 0 else b""
        payload = struct.pack(f"<I{len(block)}I", len(block), *block) + struct.pack("<I", len(extra)) + extra
        parent = hashlib.sha256(parent + payload).digest()
        out.append(parent)
    return out


@pytest.mark.parametrize("block_size", [1, 4, 16, 33])
def test_block_hashes_follow_the_documented_encoding(block_size):
    rng = random.Random(block_size)
    for _ in range(20):
        tokens = [rng.randrange(2**32) for _ in range(rng.randrange(3 * block_size + 5))]
        seed, salt = rng.choice(["", "s"]), rng.choice([None, "", "tenant-ä"])
        expected = spec_hashes(tokens, block_size, seed, salt)
        assert hashing.block_hashes(tokens, block_size, seed=seed, cache_salt=salt) == expected
        # hash_block, one block at a time, chains to the same values
        parent = hashing.root_hash(seed)
        for i, h in enumerate(expected):
            parent = hashing.hash_block(parent, tokens[i * block_size:(i + 1) * block_size],
                                        hashing.salt_bytes(salt) if i == 0 else b"")
            assert parent == h
        # continuing a chain hashes only the later blocks, to the same values
        if len(expected) >= 2:
            assert hashing.block_hashes(tokens, block_size, seed=seed, cache_salt=salt, parent=expected[0],
                                        start_block=1) == expected[1:]


def test_salts_and_seeds_change_every_block_and_bad_arguments_raise():
    tokens = list(range(64))
    plain = hashing.block_hashes(tokens, 16)
    assert len(plain) == 4 and len(set(plain)) == 4
    for other in (hashing.block_hashes(tokens, 16, cache_salt="a"), hashing.block_hashes(tokens, 16, seed="x")):
        assert not set(other) & set(plain)
    with pytest.raises(ValueError, match="block_size"):
        hashing.block_hashes(tokens, 0)
    with pytest.raises(ValueError, match="parent"):
        hashing.block_hashes(tokens, 16, start_block=1)
    with pytest.raises(OverflowError):
        hashing.block_hashes([-1] * 16, 16)
