"""`response_format` of a chat request -> the constraint its answer is decoded under.

OpenAI's shapes: {"type": "text"}, {"type": "json_object"} and
{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}; `name` is not
required here (llama.cpp's server and its test suite leave it out), and llama.cpp's
{"type": "json_object", "schema": {...}} is read as a JSON schema. Errors are InvalidRequest with
param "response_format", naming the field, or the schema keyword that cannot be enforced."""

from __future__ import annotations

from ...errors import InvalidRequest
from ...serving.constraints import UnsupportedSchema, json_object, json_schema

PARAM = "response_format"
TYPES = ("text", "json_object", "json_schema")


def parse_response_format(value):
    """A Constraint, or None for plain text."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest("'response_format' must be an object with a 'type'", param=PARAM)
    kind = value.get("type")
    if kind not in TYPES:
        raise InvalidRequest(f"'response_format.type' must be one of {', '.join(TYPES)}; got {kind!r}", param=PARAM)
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")
        return json_object() if schema is None else _schema_constraint(schema, None, "response_format.schema")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequest("'response_format.json_schema' must be an object with a 'schema'", param=PARAM)
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidRequest("'response_format.json_schema.name' must be a string", param=PARAM)
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest("'response_format.json_schema.strict' must be true or false", param=PARAM)
    schema = spec.get("schema", {})
    return _schema_constraint(schema, strict, "response_format.json_schema.schema")


def _schema_constraint(schema, strict, where: str):
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{where}' must be a JSON schema object", param=PARAM)
    try:
        return json_schema(schema, strict)
    except UnsupportedSchema as e:
        raise InvalidRequest(f"'{where}' cannot be enforced: {e.feature}", param=PARAM,
                             code="unsupported_schema") from None
