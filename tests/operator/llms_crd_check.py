"""Offline stand-in for the API server's CRD validation (test helper).

Does what kube-apiserver does with a structural schema, in its order:
apply `default`s (nested defaults after the parent's), validate the OpenAPI
schema (unknown fields rejected, as `kubectl apply`'s default strict field
validation does), then evaluate every `x-kubernetes-validations` CEL rule
with `self` bound to the value at that node.
"""
from __future__ import annotations

import copy
from typing import Any

import celpy
import jsonschema

K8S_KEYS = ("x-kubernetes-validations", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string",
            "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-embedded-resource", "nullable")


def to_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """An openAPIV3Schema node as JSON Schema (draft 2020-12)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in K8S_KEYS or key in ("default", "description", "format"):
            continue
        if key == "properties":
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = to_json_schema(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [to_json_schema(v) for v in value]
        elif key == "exclusiveMinimum" and value is True:
            out[key] = schema["minimum"]
        elif key == "exclusiveMaximum" and value is True:
            out[key] = schema["maximum"]
        else:
            out[key] = value
    if out.get("exclusiveMinimum") is not None:
        out.pop("minimum", None)
    if out.get("exclusiveMaximum") is not None:
        out.pop("maximum", None)
    if schema.get("x-kubernetes-int-or-string"):
        out = {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], v) for v in value]
    return value


def cel_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    errors: list[str] = []
    if isinstance(value, list) and schema.get("x-kubernetes-list-type") == "map":   # keys unique, as the server checks
        keys = [tuple(item.get(k) for k in schema["x-kubernetes-list-map-keys"]) for item in value]
        errors += [f"{path}[{i}]: Duplicate value: {dict(zip(schema['x-kubernetes-list-map-keys'], key))}"
                   for i, key in enumerate(keys) if key in keys[:i]]
    env = celpy.Environment()
    for rule in schema.get("x-kubernetes-validations") or []:
        program = env.program(env.compile(rule["rule"]))
        result = program.evaluate({"self": celpy.json_to_cel(value)})
        if isinstance(result, Exception) or not bool(result):
            errors.append(f"{path or '<root>'}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                errors += cel_errors(sub, value[key], f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += cel_errors(schema["items"], item, f"{path}[{i}]")
    return errors


def validate(crd: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    """Every reason the API server would refuse obj ([] = accepted)."""
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    obj = apply_defaults(schema, copy.deepcopy(obj))
    validator = jsonschema.Draft202012Validator(to_json_schema(schema))
    errors = [f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]
    return errors or cel_errors(schema, obj)
