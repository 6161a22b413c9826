"""PromptHasher: the engine's chained block hashes, ring keys, fallback."""
import pytest

from pagedkube import hashing
from pagedkube.gateway.prompt import PromptHasher, raw_text, template_messages
from pagedkube.tokenizer import Tokenizer

SYSTEM = {"role": "system", "content": "You are a helpful pet-care assistant. " * 4}


@pytest.fixture(scope="module")
def tokenizer(small_tokenizer_files) -> Tokenizer:
    return Tokenizer(small_tokenizer_files)


def session(profile: str, turns: int) -> list[dict]:
    messages = [SYSTEM, {"role": "user", "content": f"My dog is {profile}. How often should I feed him?"}]
    for t in range(1, turns):
        messages += [{"role": "assistant", "content": f"Twice a day, answer {t}."},
                     {"role": "user", "content": f"And follow-up question {t}?"}]
    return messages


def test_chat_hashes_are_the_engines(tokenizer):
    hasher = PromptHasher(tokenizer, block_size=4)
    messages = session("Rex, a beagle", 2)
    ri = hasher.routing_input("chat", {"messages": messages}, "tenant-a")
    ids = tokenizer.encode_chat(template_messages(messages))
    assert ri.num_prompt_tokens == len(ids) and ri.tokenized
    assert list(ri.block_hashes) == hashing.block_hashes(ids, 4, cache_salt="tenant-a")
    assert len(ri.block_hashes) == len(ids) // 4 > 0


def test_content_parts_and_developer_role_render_as_the_server_does(tokenizer):
    hasher = PromptHasher(tokenizer, block_size=4)
    parts = [{"role": "developer", "content": [{"type": "text", "text": "Be kind."}, {"type": "text", "text": "Hi"}]},
             {"role": "user", "content": "Rex?"}]
    plain = [{"role": "system", "content": "Be kind.\nHi"}, {"role": "user", "content": "Rex?"}]
    assert hasher.routing_input("chat", {"messages": parts}, None) == hasher.routing_input(
        "chat", {"messages": plain}, None)


def test_a_session_keeps_its_ring_key_and_sessions_differ(tokenizer):
    hasher = PromptHasher(tokenizer, block_size=4, ring_key_blocks=1000)
    keys = [hasher.routing_input("chat", {"messages": session("Rex, a beagle", t)}, None).ring_key for t in (1, 2, 5)]
    assert keys[0] == keys[1] == keys[2]
    other = hasher.routing_input("chat", {"messages": session("Bella, a poodle", 1)}, None).ring_key
    assert other != keys[0]
    # The key is the chain hash of the head's full blocks: the head is a prefix of every turn.
    head = tokenizer.encode_chat(template_messages(session("Rex, a beagle", 1)), add_generation_prompt=False)
    full = hasher.routing_input("chat", {"messages": session("Rex, a beagle", 3)}, None)
    assert keys[0] == full.block_hashes[len(head) // 4 - 1]


def test_sessions_sharing_a_long_head_share_the_key(tokenizer):
    """Questions about one long document (longer than ring_key_blocks) land together."""
    hasher = PromptHasher(tokenizer, block_size=4, ring_key_blocks=3)
    doc = {"role": "system", "content": "My dog Rex is a 3 year old beagle who loves walks. " * 3}
    a = hasher.routing_input("chat", {"messages": [doc, {"role": "user", "content": "Walks?"}]}, None)
    b = hasher.routing_input("chat", {"messages": [doc, {"role": "user", "content": "Food?"}]}, None)
    assert a.ring_key == b.ring_key == a.block_hashes[2]


def test_salt_changes_every_hash_and_the_key(tokenizer):
    hasher = PromptHasher(tokenizer, block_size=4)
    body = {"messages": session("Rex", 1)}
    a, b = hasher.routing_input("chat", body, "tenant-a"), hasher.routing_input("chat", body, "tenant-b")
    assert not set(a.block_hashes) & set(b.block_hashes)
    assert a.ring_key != b.ring_key


def test_completion_key_is_the_hash_of_the_first_k_blocks(tokenizer):
    hasher = PromptHasher(tokenizer, block_size=4, ring_key_blocks=3)
    doc = "My dog Rex is a 3 year old beagle who loves walks. " * 3
    a = hasher.routing_input("completion", {"prompt": doc + "Question one?"}, None)
    b = hasher.routing_input("completion", {"prompt": doc + "Another question entirely?"}, None)
    ids = tokenizer.encode(doc + "Question one?")
    assert list(a.block_hashes) == hashing.block_hashes(ids, 4)
    assert a.ring_key == a.block_hashes[2] == b.ring_key
    by_ids = hasher.routing_input("completion", {"prompt": ids}, None)
    assert by_ids.block_hashes == a.block_hashes
    batch = hasher.routing_input("completion", {"prompt": [doc + "Question one?", "x"]}, None)
    assert batch.block_hashes == a.block_hashes
    short = hasher.routing_input("completion", {"prompt": [5, 6]}, None)
    assert short.block_hashes == () and short.tokenized and len(short.ring_key) == 32


def test_no_tokenizer_or_bad_template_falls_back_to_raw_text(tokenizer):
    body = {"messages": session("Rex", 1)}
    ri = PromptHasher(None).routing_input("chat", body, None)
    assert not ri.tokenized and ri.block_hashes == ()
    assert ri == PromptHasher(None).routing_input("chat", {"messages": session("Rex", 3)}, None)  # turn-stable
    assert raw_text("chat", body).startswith("system: You are")
    hasher = PromptHasher(tokenizer, block_size=4)
    broken = PromptHasher(Tokenizer({"tokenizer.json": tokenizer.files["tokenizer.json"]}), block_size=4)
    assert not broken.routing_input("chat", body, None).tokenized  # no chat template: fallback, no error
    assert not hasher.routing_input("completion", {"prompt": {"not": "a prompt"}}, None).tokenized
    with pytest.raises(ValueError):
        PromptHasher(tokenizer, block_size=0)


def test_cached_pieces_change_nothing(tokenizer):
    """One hasher sees every session's turns (its piece cache fills); each answer
    equals a fresh hasher's and the engine's own tokens."""
    warm = PromptHasher(tokenizer, block_size=4, head_cache=2)
    for profile in ("Rex, a beagle", "Tom, a cat", "Ada, a parrot"):
        for turns in (1, 2, 3):
            body = {"messages": session(profile, turns)}
            for salt in (None, "tenant-a"):
                ri = warm.routing_input("chat", body, salt)
                assert ri == PromptHasher(tokenizer, block_size=4).routing_input("chat", body, salt)
                ids = tokenizer.encode_chat(template_messages(body["messages"]))
                assert list(ri.block_hashes) == hashing.block_hashes(ids, 4, cache_salt=salt)
    assert warm.encoder.exact and warm.encoder._pieces
    head = template_messages(session("Ada, a parrot", 1))
    assert len(warm._heads) == 2  # bounded
    assert list(warm._heads.values())[-1] == tokenizer.encode_chat(head, add_generation_prompt=False)


def test_big_prompts_hash_alike_in_the_pool_and_on_the_loop(tokenizer):
    """The pool's path (cached=False: no shared caches) gives what the event loop's gives,
    and a head of ~200 K characters keyed from its text's prefix gives the key of its
    whole encoding; token ids a block hash cannot encode route on the fallback key."""
    hasher = PromptHasher(tokenizer, block_size=4, ring_key_blocks=8)
    big = "My dog Rex is a 3 year old beagle who loves walks. " * 4000
    messages = [SYSTEM, {"role": "user", "content": big}, {"role": "assistant", "content": "Yes."},
                {"role": "user", "content": "And cats?"}]
    pooled = hasher.routing_input("chat", {"messages": messages}, "t", cached=False)
    assert pooled == hasher.routing_input("chat", {"messages": messages}, "t")
    head_ids = tokenizer.encode_chat(template_messages(messages[:2]), add_generation_prompt=False)
    assert pooled.ring_key == hashing.block_hashes(head_ids[:8 * 4], 4, cache_salt="t")[-1]
    ids = tokenizer.encode_chat(template_messages(messages))
    assert list(pooled.block_hashes) == hashing.block_hashes(ids, 4, cache_salt="t")
    for prompt in ([-1, 5], [5, 2 ** 32]):
        ri = hasher.routing_input("completion", {"prompt": prompt}, None)
        assert not ri.tokenized and ri == hasher.fallback("completion", {"prompt": prompt}, None)
