"""Constrained decoding in the engine (engine/structured/), on the built-in model, offline.

Every kind of constraint yields outputs that match it; unconstrained sequences in the same
steps produce exactly their tokens alone; n > 1, preemption and the prefix cache keep working;
EOS is allowed exactly when the grammar may end; max_tokens mid-object ends with "length";
grammars compile once and off the step loop, and one that compiles too long fails only its
own request.
"""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from pagedkube.engine import LLM, SamplingParams
from pagedkube.engine.structured.params import StructuredOutputsParams as Structured

PROMPT = "My dog barks at night. What should I do?"
BOOKING = {"type": "object", "additionalProperties": False, "required": ["name", "age", "slot"],
           "properties": {"name": {"type": "string", "maxLength": 12},
                          "age": {"type": "integer", "minimum": 0, "maximum": 25},
                          "slot": {"enum": ["morning", "afternoon"]},
                          "vaccines": {"type": "array", "items": {"enum": ["rabies", "parvo"]}, "maxItems": 2}}}
SUM_GRAMMAR = 'root ::= term (" + " term)* " = " number\nterm ::= number | "(" term " * " term ")"\nnumber ::= [1-9] [0-9]?'


@pytest.fixture(scope="module")
def llm():
    return LLM("builtin://tiny", device="cpu", dtype="float32", max_model_len=512, seed=0)


def sampled(structured: Structured, seed: int, n: int = 1, max_tokens: int = 120, **kw) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, n=n, max_tokens=max_tokens, structured_outputs=structured, **kw)


def parse_sum(text: str) -> bool:
    """A recursive-descent check of SUM_GRAMMAR (independent of the grammar library)."""
    at = 0

    def number() -> bool:
        nonlocal at
        m = re.compile(r"[1-9][0-9]?").match(text, at)
        if not m:
            return False
        at = m.end()
        return True

    def term() -> bool:
        nonlocal at
        if text.startswith("(", at):
            at += 1
            if not term() or not text.startswith(" * ", at):
                return False
            at += 3
            if not term() or not text.startswith(")", at):
                return False
            at += 1
            return True
        return number()

    if not term():
        return False
    while text.startswith(" + ", at):
        at += 3
        if not term():
            return False
    if not text.startswith(" = ", at):
        return False
    at += 3
    return number() and at == len(text)


def test_every_kind_of_constraint_holds_when_sampled(llm):
    cases = [(Structured(json=BOOKING), lambda t: jsonschema.validate(json.loads(t), BOOKING) is None),
             (Structured(json_object=True), lambda t: isinstance(json.loads(t), dict)),
             (Structured(regex=r"[A-Z][a-z]{2,7} is [0-9]{1,2} years old\."),
              lambda t: re.fullmatch(r"[A-Z][a-z]{2,7} is [0-9]{1,2} years old\.", t) is not None),
             (Structured(choice=["walk", "sit", "stay down"]), lambda t: t in ("walk", "sit", "stay down")),
             (Structured(grammar=SUM_GRAMMAR), parse_sum),
             (Structured(grammar='start: "woof" ("!" | "?")~1..3'), lambda t: re.fullmatch(r"woof[!?]{1,3}", t))]
    params = [sampled(s, seed=i, n=3) for i, (s, _) in enumerate(cases)]
    outs = llm.generate([PROMPT] * len(cases), params)
    for (structured, check), out in zip(cases, outs):
        stopped = [c for c in out.outputs if c.finish_reason == "stop"]
        assert stopped, (structured.kind, [c.text for c in out.outputs])
        for c in stopped:
            assert check(c.text), (structured.kind, c.text)


def test_unconstrained_rows_are_exactly_what_they_are_alone(llm):
    plain = [f"Question {i}: my puppy chews shoes." for i in range(4)]
    greedy = SamplingParams(temperature=0, max_tokens=24)
    alone = [o.outputs[0].token_ids for o in llm.generate(plain, greedy)]
    mixed_prompts = [p for pair in zip(plain, [PROMPT] * 4) for p in pair]
    mixed_params = [p for pair in zip([greedy] * 4, [sampled(Structured(json=BOOKING), seed=i) for i in range(4)])
                    for p in pair]
    mixed = llm.generate(mixed_prompts, mixed_params)
    assert [o.outputs[0].token_ids for o in mixed[0::2]] == alone
    assert all(o.outputs[0].text.startswith('{"name": "') for o in mixed[1::2])


def test_n_samples_each_follow_the_grammar_from_its_start(llm):
    out = llm.generate([PROMPT], sampled(Structured(regex=r"(Rex|Bella|Max) is a (beagle|poodle|lab)"),
                                         seed=7, n=6))[0]
    texts = [c.text for c in out.outputs]
    assert all(re.fullmatch(r"(Rex|Bella|Max) is a (beagle|poodle|lab)", t) for t in texts), texts
    assert len(set(texts)) > 1


def test_preemption_keeps_the_grammar_state(llm):
    """A pool too small for every sequence preempts some (recompute); their outputs equal
    the ones from a roomy pool, token for token (greedy)."""
    prompts = [f"Dog {i}: {PROMPT}" for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=60, structured_outputs=Structured(json=BOOKING))
    roomy = llm.generate(prompts, params)
    cramped = LLM("builtin://tiny", device="cpu", dtype="float32", max_model_len=512, num_kv_blocks=14, block_size=16)
    tight = cramped.generate(prompts, params)
    assert cramped.engine.stats().num_preemptions > 0
    assert [o.outputs[0].token_ids for o in tight] == [o.outputs[0].token_ids for o in roomy]
    for o in tight:
        if o.outputs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(o.outputs[0].text), BOOKING)


def test_the_prefix_cache_is_unaffected(llm):
    prompt = "A long shared system prompt about dog training. " * 6
    first = llm.generate([prompt], sampled(Structured(choice=["yes", "no"]), seed=1))[0]
    second = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4))[0]
    third = llm.generate([prompt], sampled(Structured(choice=["yes", "no"]), seed=2))[0]
    full_blocks = (len(first.prompt_token_ids) - 1) // 16 * 16
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == third.num_cached_tokens == full_blocks > 0


def test_eos_only_where_the_grammar_may_end(llm):
    """The choice's words end with the model's EOS, and a stop is never sampled early: the
    output is a whole choice even when the model would rather stop (min_tokens cannot
    force more tokens than the grammar allows either)."""
    eos = set(llm.engine.eos_token_ids)
    outs = llm.generate([PROMPT] * 3, [sampled(Structured(choice=["sit down", "paw"]), seed=s, min_tokens=m)
                                       for s, m in ((0, 0), (1, 0), (2, 8))])
    for out in outs:
        c = out.outputs[0]
        assert c.finish_reason == "stop" and c.text in ("sit down", "paw")
        assert c.token_ids[-1] in eos and not eos & set(c.token_ids[:-1])


def test_ignore_eos_still_stops_when_the_grammar_is_done(llm):
    out = llm.generate([PROMPT], sampled(Structured(choice=["sit"]), seed=0, ignore_eos=True, max_tokens=50))[0]
    assert (out.outputs[0].text, out.outputs[0].finish_reason) == ("sit", "stop")


def test_max_tokens_mid_object_is_length(llm):
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=5,
                                                structured_outputs=Structured(json=BOOKING)))[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    assert '{"name": '.startswith(out.text) or out.text.startswith('{"name": ')
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


def test_a_grammar_compiles_once_for_every_request_that_uses_it(llm):
    schema = {"type": "object", "properties": {"once": {"type": "boolean"}}, "required": ["once"]}
    before = llm.engine.structured.compiler.num_compiles
    outs = llm.generate([PROMPT] * 5, [sampled(Structured(json=schema), seed=i) for i in range(5)])
    outs += llm.generate([PROMPT], sampled(Structured(json=json.dumps(schema)), seed=9))
    assert llm.engine.structured.compiler.num_compiles == before + 1
    assert all(json.loads(o.outputs[0].text)["once"] in (True, False) for o in outs)


def test_a_grammar_past_the_compile_deadline_fails_only_its_request():
    slow = LLM("builtin://tiny", device="cpu", dtype="float32", max_model_len=512, grammar_compile_timeout=0.001)
    huge = Structured(json={"type": "object", "properties": {f"field_{i}": {"type": "string", "pattern": f"^[a-z]{{{i % 9 + 1}}}[0-9]+$"}
                                                            for i in range(600)}})
    with pytest.raises(ValueError, match="did not compile within 0.001 s"):
        slow.generate([PROMPT], SamplingParams(max_tokens=8, structured_outputs=huge))
    assert not slow.engine.has_unfinished_requests()
    ok = slow.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8))[0]
    assert ok.outputs[0].finish_reason == "length"


def test_constraints_are_checked_on_construction():
    with pytest.raises(ValueError, match="exactly one"):
        Structured(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="exactly one"):
        Structured()
    with pytest.raises(ValueError, match="not valid JSON"):
        Structured(json="{nope")
    with pytest.raises(ValueError, match="at most 131072"):
        Structured(regex="a" * (200 * 1024))
    with pytest.raises(ValueError, match="choice"):
        Structured(choice=[])


@pytest.mark.parametrize("structured, message", [
    (Structured(json={"type": "strin"}), "Unsupported type"),
    (Structured(regex="(x"), "parenthesis"),
    (Structured(grammar="root ::= "), "EBNF"),
    (Structured(json={"type": "array", "uniqueItems": True}), "uniqueItems"),
])
def test_an_unparseable_constraint_is_a_value_error_before_anything_runs(llm, structured, message):
    from pagedkube.engine.structured.grammars import parse

    with pytest.raises(ValueError, match=message):
        parse(structured)
    with pytest.raises(ValueError, match=message):
        llm.generate([PROMPT], SamplingParams(max_tokens=4, structured_outputs=structured))
    assert not llm.engine.has_unfinished_requests()
