"""Valid by construction, at scale: 105 JSON Schemas (tests/helpers/schema_factory.py: the
pet-care forms plus generated ones with nested objects, arrays with bounds, enums, consts,
patterns, formats, number bounds, multipleOf, anyOf, prefixItems, `additionalProperties:
false` and `$ref`/`$defs`, recursion included), each answered with sampling at temperature 1
by the built-in model and by the default model (SmolLM2-135M). Every schema jsonschema
accepts is either refused up front (a ValueError naming what cannot be enforced) or gets an
answer; every answer that stops by itself validates with jsonschema and its format checker.
"""
from __future__ import annotations

import json

import jsonschema
import pytest

from pagedkube.engine import LLM, SamplingParams
from pagedkube.engine.structured.grammars import parse
from pagedkube.engine.structured.params import StructuredOutputsParams as Structured
from schema_factory import schema_set

SCHEMAS = schema_set(105, seed=0)
VALIDATOR = jsonschema.Draft202012Validator


def answers(model: str, schemas: list[dict]) -> tuple[list[tuple[int, object]], list[int]]:
    llm = LLM(model, device="cpu", max_model_len=1024, seed=0)
    accepted, params = [], []
    for i, schema in enumerate(schemas):
        VALIDATOR.check_schema(schema)
        try:
            parse(Structured(json=schema))
        except ValueError:
            continue
        accepted.append(i)
        params.append(SamplingParams(temperature=1.0, seed=i, max_tokens=300, structured_outputs=Structured(json=schema)))
    outs = llm.generate(["Fill in this form about my dog, as JSON:"] * len(params), params)
    return list(zip(accepted, [o.outputs[0] for o in outs])), accepted


def check(results, schemas) -> int:
    stopped = 0
    for i, out in results:
        assert out.finish_reason in ("stop", "length")
        if out.finish_reason == "stop":
            stopped += 1
            jsonschema.validate(json.loads(out.text), schemas[i], format_checker=VALIDATOR.FORMAT_CHECKER)
    return stopped


@pytest.mark.slow
@pytest.mark.parametrize("model", ["builtin://tiny", "smollm2-135m-instruct"])
def test_every_answer_that_stops_validates(model):
    results, accepted = answers(model, SCHEMAS)
    assert len(accepted) >= 100               # refusals are rare and named (tests below)
    assert len(results) == len(accepted)      # every accepted schema got an answer
    stopped = check(results, SCHEMAS)
    assert stopped >= 0.85 * len(results), f"only {stopped} of {len(results)} stopped"
