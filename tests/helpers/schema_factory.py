"""JSON Schemas for the structured-outputs validity tests: a few written by hand
(the pet-care forms our users fill) and many generated from a seed.

The generator covers what applications send: nested objects, arrays with
minItems/maxItems, enums and consts, string patterns and lengths, formats,
integers and numbers with bounds, `required`, `additionalProperties: false`,
anyOf, and `$ref` into `$defs` (recursive ones included). Deterministic:
schema i of seed s is always the same.
"""
from __future__ import annotations

import random
from typing import Any

WORDS = ["name", "breed", "age", "weight", "owner", "clinic", "date", "time", "reason", "notes", "vaccines",
         "allergies", "diet", "walks", "toys", "vet", "dose", "drug", "pet", "visit", "phone", "email", "city",
         "tags", "score", "level", "kind", "color", "size", "mood"]
PATTERNS = [r"^[A-Z][a-z]{1,10}( [A-Z][a-z]{1,10})?$", r"^[0-9]{1,3}(\.[0-9]{1,2})?( kg)?$",
            r"^[A-Z][a-z]{1,10}$", r"^\d{3}-\d{4}$", r"^(morning|afternoon|evening)$", r"^[a-z]+(-[a-z]+)*$",
            r"^2026-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])$", r"^[A-Z]{2}\d{2,4}$"]
FORMATS = ["date", "time", "date-time", "email", "uuid", "ipv4"]

VET_BOOKING = {
    "title": "VetBooking", "type": "object", "additionalProperties": False,
    "properties": {
        "pet_name": {"type": "string", "minLength": 1, "maxLength": 30},
        "species": {"enum": ["dog", "cat", "rabbit", "bird"]},
        "age_years": {"type": "integer", "minimum": 0, "maximum": 30},
        "weight_kg": {"type": "number", "minimum": 0.1, "maximum": 120},
        "date": {"type": "string", "pattern": r"^2026-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"},
        "slot": {"enum": ["morning", "afternoon", "evening"]},
        "reason": {"type": "string", "maxLength": 80},
        "vaccinated": {"type": "boolean"},
        "symptoms": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 0, "maxItems": 4},
        "owner": {"$ref": "#/$defs/owner"},
    },
    "required": ["pet_name", "species", "age_years", "date", "slot", "reason", "owner"],
    "$defs": {"owner": {"type": "object", "additionalProperties": False,
                        "properties": {"name": {"type": "string", "maxLength": 40},
                                       "phone": {"type": "string", "pattern": r"^\+?[0-9]{7,12}$"}},
                        "required": ["name", "phone"]}},
}
MEDICATION_LOOKUP = {
    "type": "object",
    "properties": {"drug": {"type": "string", "maxLength": 40}, "species": {"enum": ["dog", "cat"]},
                   "weight_kg": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
                   "dose_mg": {"type": ["number", "null"]}},
    "required": ["drug", "species", "weight_kg"], "additionalProperties": False,
}
TREE = {  # a recursive $ref: a chat thread with replies
    "$defs": {"msg": {"type": "object", "properties": {
        "text": {"type": "string", "maxLength": 20},
        "replies": {"type": "array", "items": {"$ref": "#/$defs/msg"}, "maxItems": 2}},
        "required": ["text"], "additionalProperties": False}},
    "$ref": "#/$defs/msg",
}
HAND_WRITTEN = [VET_BOOKING, MEDICATION_LOOKUP, TREE]


class _Gen:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.defs: dict[str, Any] = {}

    def scalar(self) -> dict[str, Any]:
        r = self.rng
        kind = r.choice(["string", "string", "integer", "number", "boolean", "enum", "const", "null", "pattern",
                         "format", "nullable", "multiple", "mixed_enum", "plain"])
        if kind == "multiple":
            return {"type": "integer", "multipleOf": r.choice([2, 5, 10]), "minimum": 0, "maximum": r.randint(10, 200)}
        if kind == "mixed_enum":
            return {"enum": [r.randint(0, 9), r.choice(WORDS), None, True]}
        if kind == "plain":
            return {"type": r.choice(["string", "integer", "number"])}
        if kind == "string":
            return {"type": "string", "minLength": r.randint(0, 3), "maxLength": r.randint(4, 24)}
        if kind == "integer":
            low = r.randint(-50, 50)
            s = {"type": "integer", "minimum": low, "maximum": low + r.randint(0, 500)}
            if r.random() < 0.3:
                s["exclusiveMaximum"] = s.pop("maximum")
            return s
        if kind == "number":
            low = round(r.uniform(-10, 10), 2)
            return {"type": "number", "minimum": low, "maximum": round(low + r.uniform(0.5, 100), 2)}
        if kind == "boolean":
            return {"type": "boolean"}
        if kind == "enum":
            return {"enum": r.sample(WORDS, r.randint(1, 5))}
        if kind == "const":
            return {"const": r.choice(WORDS)}
        if kind == "null":
            return {"type": "null"}
        if kind == "pattern":
            return {"type": "string", "pattern": r.choice(PATTERNS)}
        if kind == "format":
            return {"type": "string", "format": r.choice(FORMATS)}
        return {"type": ["string", "null"], "maxLength": r.randint(1, 12)}

    def value(self, depth: int) -> dict[str, Any]:
        r = self.rng
        roll = r.random()
        if depth > 0 and roll < 0.25:
            return self.obj(depth - 1)
        if depth > 0 and roll < 0.45:
            low = r.randint(0, 2)
            return {"type": "array", "items": self.value(depth - 1), "minItems": low, "maxItems": low + r.randint(0, 3)}
        if depth > 0 and roll < 0.5:
            return {"anyOf": [self.scalar(), self.scalar()]}
        if depth > 0 and roll < 0.52:
            return {"type": "array", "prefixItems": [self.scalar(), self.scalar()], "items": False}
        if depth > 0 and roll < 0.6:
            name = f"def{len(self.defs)}"
            self.defs[name] = self.obj(depth - 1)
            return {"$ref": f"#/$defs/{name}"}
        return self.scalar()

    def obj(self, depth: int) -> dict[str, Any]:
        r = self.rng
        names = r.sample(WORDS, r.randint(1, 5))
        props = {n: self.value(depth) for n in names}
        s: dict[str, Any] = {"type": "object", "properties": props,
                             "required": sorted(r.sample(names, r.randint(0, len(names))), key=names.index)}
        if r.random() < 0.7:
            s["additionalProperties"] = False
        if r.random() < 0.1 and len(names) > 1:
            s["minProperties"] = 1
        return s


def generated_schema(seed: int, index: int) -> dict[str, Any]:
    gen = _Gen(random.Random(f"{seed}:{index}"))
    schema = gen.obj(depth=gen.rng.randint(1, 3))
    if gen.defs:
        schema["$defs"] = gen.defs
    return schema


def schema_set(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """The hand-written schemas, then generated ones: `count` in all."""
    return HAND_WRITTEN + [generated_schema(seed, i) for i in range(count - len(HAND_WRITTEN))]
