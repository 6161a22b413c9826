"""CachedEncoder: the tokenizer's ids, id for id, with pieces between added tokens cached."""
import json
import random

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from pagedkube.piece_cache import CachedEncoder
from pagedkube.tokenizer import Tokenizer
from model_factory import BUILTIN_TINY

CORPUS = ["My dog Rex is a three-year-old beagle who loves long walks in the park.",
          "How often should I feed a senior labrador? Twice a day is fine for most adult dogs.",
          "Die Katze schläft; naïve café owners in 東京 keep 🐶 emojis.\n\n  Indented\tline\r\n"] * 20
SPECIALS = ["<|im_start|>", "<|im_end|>", "<s>", "</s>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def trained(kind: str, **options) -> Tokenizer:
    if kind == "bytelevel":
        tok = HFTokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=options.get("add_prefix_space", False))
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:  # sentencepiece-style, as Llama 2 and Mistral
        tok = HFTokenizer(models.BPE(byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=options["prepend_scheme"])
        tok.decoder = decoders.Metaspace(prepend_scheme=options["prepend_scheme"])
        alphabet = []
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                        initial_alphabet=alphabet, show_progress=False))
    if options.get("bos_template"):  # as Llama 3: add_special_tokens=True prepends a BOS
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", tok.token_to_id("<s>"))])
    config = {"chat_template": TEMPLATE, "eos_token": "<|im_end|>"}
    if options.get("lstrip"):
        spec = json.loads(tok.to_str())
        spec["added_tokens"][1]["lstrip"] = True
        return Tokenizer({"tokenizer.json": json.dumps(spec), "tokenizer_config.json": json.dumps(config)})
    return Tokenizer({"tokenizer.json": tok.to_str(), "tokenizer_config.json": json.dumps(config)})


def random_texts(seed: int, count: int = 200) -> list[str]:
    rng = random.Random(seed)
    alphabet = list("abc XYZ\n\n\t  .,!?'-") + ["é", "東", "🐶", "\r\n", "'s", "  "] + SPECIALS + ["<|im", "end|>"]
    return [rng.choice(CORPUS)[:rng.randrange(60)] + "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
            for _ in range(count)]


def chats(seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    system = {"role": "system", "content": "You are a pet-care assistant. " * 3}
    out = []
    for s in range(6):
        messages = [system, {"role": "user", "content": f"My dog {s} is {rng.choice(CORPUS)[:40]} "}]
        for t in range(4):
            messages += [{"role": "assistant", "content": rng.choice(CORPUS)[:rng.randrange(1, 70)]},
                         {"role": "user", "content": f" question {t}:\n{rng.choice(CORPUS)[:30]}  "}]
            out.append(list(messages))
    return out


@pytest.fixture(scope="module", params=["builtin", "bytelevel", "bytelevel-prefix-space", "metaspace-always",
                                        "bytelevel-bos-template"])
def tokenizer(request) -> Tokenizer:
    if request.param == "builtin":
        return Tokenizer.from_pretrained(BUILTIN_TINY)
    if request.param == "metaspace-always":
        return trained("metaspace", prepend_scheme="always")
    if request.param == "bytelevel-bos-template":
        return trained("bytelevel", bos_template=True)
    return trained("bytelevel", add_prefix_space=request.param.endswith("prefix-space"))


def test_ids_equal_the_tokenizers_and_repeats_hit_the_cache(tokenizer):
    encoder = CachedEncoder(tokenizer)
    assert encoder.exact
    for text in random_texts(0) * 2:  # the second pass comes from the cache
        assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False), text
        assert encoder.encode(text, add_special_tokens=True) == tokenizer.encode(text, add_special_tokens=True)
    for messages in chats(1) * 2:
        assert encoder.encode_chat(messages) == tokenizer.encode_chat(messages)
        assert encoder.encode_chat(messages, add_generation_prompt=False) == tokenizer.encode_chat(
            messages, add_generation_prompt=False)
    assert encoder._pieces, "pieces were cached"


def test_cached_ids_are_not_shared_with_callers(tokenizer):
    encoder = CachedEncoder(tokenizer)
    text = "a piece long enough to be cached"
    encoder.encode(text).append(-1)
    assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("kind, options", [("metaspace", {"prepend_scheme": "first"}),
                                           ("bytelevel", {"lstrip": True})])
def test_tokenizers_the_cache_cannot_match_go_straight_through(kind, options):
    tokenizer = trained(kind, **options)
    encoder = CachedEncoder(tokenizer)
    assert not encoder.exact
    for text in random_texts(2, 50):
        assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    for text in random_texts(3, 20):
        assert encoder.encode(text, add_special_tokens=True) == tokenizer.encode(text, add_special_tokens=True)
    assert not encoder._pieces


def test_the_self_check_catches_what_the_rules_miss(monkeypatch):
    import pagedkube.piece_cache as piece_cache
    monkeypatch.setattr(piece_cache, "_exact_by_construction", lambda spec: True)
    for kind, options in [("metaspace", {"prepend_scheme": "first"}), ("bytelevel", {"lstrip": True})]:
        assert not piece_cache.CachedEncoder(trained(kind, **options)).exact


def test_memory_is_bounded_by_characters():
    tokenizer = Tokenizer.from_pretrained(BUILTIN_TINY)
    encoder = CachedEncoder(tokenizer, max_chars=100)
    pieces = [f"message number {i} about a dog" for i in range(20)]
    for p in pieces:
        assert encoder.encode(f"<|im_start|>{p}<|im_end|>") == tokenizer.encode(
            f"<|im_start|>{p}<|im_end|>", add_special_tokens=False)
        assert encoder._chars == sum(map(len, encoder._pieces)) <= 100
    assert list(encoder._pieces) == pieces[-len(encoder._pieces):]  # least recently used go first
    with pytest.raises(ValueError, match="max_chars"):
        CachedEncoder(tokenizer, max_chars=-1)
