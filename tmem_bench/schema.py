"""Declared schemas of the files a user writes or the suite reads back (profiles, cell
results), checked with jsonschema; a violation becomes one line naming the file, the
key and what is allowed."""
from __future__ import annotations

import json
import math
from functools import cache
from importlib import resources

import jsonschema

from .errors import UsageError


# Files whose numbers are never nan or inf: a profile is written by hand, where they can only be typos
# (TOML reads `nan` and `inf` as numbers), and selection.json is strict JSON. A cell's losses may be.
FINITE = ("profile", "selection")


def _finite_number(checker, instance) -> bool:
    return jsonschema.Draft202012Validator.TYPE_CHECKER.is_type(instance, "number") and math.isfinite(instance)


_Finite = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("number", _finite_number))


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(resources.files("tmem_bench").joinpath("schemas", f"{name}.schema.json").read_text())
    return (_Finite if name in FINITE else jsonschema.Draft202012Validator)(schema)


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
            one = error.schema["anyOf"][0]
            return (f"{error.instance!r} is not a learning rate (a finite number > {one['exclusiveMinimum']} "
                    f"and <= {one['maximum']}) or a list of them")
        return f"{error.instance!r} is not a model name or a table with a 'name'"
    if error.validator == "type" and isinstance(error.instance, float) and not math.isfinite(error.instance):
        return f"{error.instance!r} is not a finite number"
    if error.validator == "uniqueItems":
        return f"{error.instance!r} lists a value twice"
    return error.message


def violations(instance, name: str) -> list[jsonschema.ValidationError]:
    """Every violation of schema `name` by `instance`, in document order."""
    return sorted(_validator(name).iter_errors(instance), key=lambda e: (list(map(str, e.absolute_path)), e.message))


def describe(error: jsonschema.ValidationError) -> str:
    """One line: the key and what is wrong with it. Where no branch of an anyOf fits, but one fits
    as far as a key inside the value (a model's table with its own `train`), that key is named."""
    inner = max(error.context or [], key=lambda e: len(e.absolute_path), default=None)
    if (error.validator == "anyOf" and isinstance(error.instance, dict) and inner is not None
            and len(inner.absolute_path) > len(error.absolute_path)):
        return describe(inner)
    return f"{_where(error)}: {_message(error)}"


def problems(instance, name: str) -> list[str]:
    return [describe(e) for e in violations(instance, name)]


def check(instance, name: str, source: str) -> None:
    """A UsageError naming `source` and the first violation of schema `name`."""
    found = problems(instance, name)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UsageError(f"{source}: {found[0]}{more}")
