"""Declared schemas of the files a user writes or the suite reads back (profiles, cell
results), checked with jsonschema; a violation becomes one line naming the file, the
key and what is allowed."""
from __future__ import annotations

import json
from functools import cache
from importlib import resources

import jsonschema

from .errors import UsageError


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(resources.files("tmem_bench").joinpath("schemas", f"{name}.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def _where(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "the top level"


def _message(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed))
        return f"unknown key {', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}"
    if error.validator == "required":
        return error.message
    if error.validator == "anyOf":
        if error.schema_path and "lr" in map(str, error.schema_path):
            return f"{error.instance!r} is not a learning rate (a positive number) or a list of them"
        return f"{error.instance!r} is not a model name or a table with a 'name'"
    if error.validator == "uniqueItems":
        return f"{error.instance!r} lists a value twice"
    return error.message


def violations(instance, name: str) -> list[jsonschema.ValidationError]:
    """Every violation of schema `name` by `instance`, in document order."""
    return sorted(_validator(name).iter_errors(instance), key=lambda e: (list(map(str, e.absolute_path)), e.message))


def describe(error: jsonschema.ValidationError) -> str:
    """One line: the key and what is wrong with it."""
    return f"{_where(error)}: {_message(error)}"


def problems(instance, name: str) -> list[str]:
    return [describe(e) for e in violations(instance, name)]


def check(instance, name: str, source: str) -> None:
    """A UsageError naming `source` and the first violation of schema `name`."""
    found = problems(instance, name)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UsageError(f"{source}: {found[0]}{more}")
