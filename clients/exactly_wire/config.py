"""One configuration schema for every client and service: key, type, default, allowed
values or range, importance and documentation, with Kafka's names and defaults.

Each role (producer, consumer, admin, and the three services) is a pydantic model
whose fields carry the Kafka key as alias. `parse(schema, conf)` validates a mapping
of settings (values may be native Python values or strings, as from `--set` or a
properties file) and returns the model with every key resolved (defaults filled).
An unknown key, a key Exactly deliberately does not support, or a wrong value raises
`ConfigurationError` (the SDK's `errors.ConfigurationError`) naming the key, the value and what is allowed.
`markdown_table(schema)` renders the configuration reference's tables (docs/reference/configuration.md) from the same
definitions (docs/design.md, "SDK"). The client schemas are in `exactly.config`,
the services' in `services.common.settings`.

Values are read once, here: booleans are `true`/`false` (any case) or Python bools;
numbers are integers (strings of digits accepted); ms and bytes are the units of the
keys that end in `.ms` and `.bytes`/`.size`/`.memory`.
"""
from __future__ import annotations

import difflib
import typing
from typing import Any, ClassVar, Literal, Mapping, TypeVar

import annotated_types
import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator

M = TypeVar("M", bound="ConfigSchema")


class ConfigurationError(ValueError):
    """A configuration key is unknown or unsupported, or its value is of the wrong
    type or outside the allowed values. Attributes: `key`, `value` (as given) and
    `allowed` (what the key accepts, in words). The SDK raises its subclass
    `exactly.errors.ConfigurationError`."""

    def __init__(self, message: str | None = None, key: str | None = None, value: object = None,
                 allowed: str | None = None):
        super().__init__(message)
        self.key = key
        self.value = value
        self.allowed = allowed

INT32_MAX = 2147483647

HIGH, MEDIUM, LOW = "high", "medium", "low"


def setting(key: str, default: Any, doc: str, importance: str = MEDIUM, **constraints: Any) -> Any:
    """A schema entry: `key` (Kafka's name), `default` (`...` for a required key),
    `doc` (one sentence, units included), `importance` (high | medium | low) and
    pydantic constraints (`ge`, `le`, ...). Returns a pydantic Field."""
    return Field(default, alias=key, description=doc, json_schema_extra={"importance": importance},
                 **constraints)


def _strict_bool(value: Any) -> Any:
    """The one boolean parser: Python bools, or "true"/"false" in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError("expected true or false")


Bool = typing.Annotated[bool, pydantic.BeforeValidator(_strict_bool)]


class ConfigSchema(BaseModel):
    """Base of every role's schema. `ROLE` names the role in error messages;
    `UNSUPPORTED` maps keys (or key prefixes ending in ".") that Kafka clients or
    brokers have and Exactly deliberately does not, to the explanation given;
    `ERROR` is the ConfigurationError class `parse` raises."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False,
                              str_strip_whitespace=True, hide_input_in_errors=False)

    ROLE: ClassVar[str] = "client"
    UNSUPPORTED: ClassVar[dict[str, str]] = {}
    ERROR: ClassVar[type[ConfigurationError]] = ConfigurationError

    @field_validator("*", mode="before")
    @classmethod
    def _enum_any_case(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        """Values of enumerated keys match in any case (`ZSTD`, `Read_Committed`)."""
        if isinstance(value, str) and info.field_name is not None:
            choices = _literal_values(cls.model_fields[info.field_name].annotation)
            for choice in choices:
                if isinstance(choice, str) and choice.lower() == value.strip().lower():
                    return choice
        return value

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "ROLE" in cls.__dict__:
            _ROLES.append(cls)

    def get(self, key: str) -> Any:
        """The value of setting `key` (Kafka's name), for code that maps keys to keys (a
        topic config to its broker-level synonym). Raises KeyError for a key the schema
        does not define."""
        name = _field_by_key(type(self)).get(key)
        if name is None:
            raise KeyError(key)
        return getattr(self, name)


_ROLES: list[type[ConfigSchema]] = []  # every schema that names a role, for hints


def _field_by_key(schema: type[ConfigSchema]) -> dict[str, str]:
    return {info.alias: name for name, info in schema.model_fields.items()}


def _literal_values(ann: Any) -> tuple[Any, ...]:
    literal = next((a for a in (ann, *typing.get_args(ann)) if typing.get_origin(a) is Literal), None)
    return typing.get_args(literal) if literal is not None else ()


def keys(schema: type[ConfigSchema]) -> list[str]:
    """The Kafka keys `schema` defines, in definition order."""
    return list(_field_by_key(schema))


def allowed(schema: type[ConfigSchema], key: str) -> str:
    """What `key` accepts, in words (e.g. "one of: none, gzip" or "an integer >= 0")."""
    info = schema.model_fields[_field_by_key(schema)[key]]
    ann = info.annotation
    args = typing.get_args(ann)
    choices = _literal_values(ann)
    if choices:
        return "one of: " + ", ".join(str(v) for v in choices)
    base = next((a for a in (ann, *args) if a in (int, float, str, bool)), str)
    if base is bool or _is_bool(ann):
        return "true or false"
    what = {int: "an integer", float: "a number", str: "a string"}[base]
    bounds = []
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            bounds.append(f">= {m.ge}")
        elif isinstance(m, annotated_types.Le):
            bounds.append(f"<= {m.le}")
        elif isinstance(m, annotated_types.Gt):
            bounds.append(f"> {m.gt}")
    text = what + (" " + " and ".join(bounds) if bounds else "")
    if type(None) in args:
        text += " (or unset)"
    return text


def _is_bool(ann: Any) -> bool:
    return ann is bool or typing.get_origin(ann) is typing.Annotated and typing.get_args(ann)[0] is bool


def _unsupported(schema: type[ConfigSchema], key: str) -> str | None:
    if key in schema.UNSUPPORTED:
        return schema.UNSUPPORTED[key]
    for prefix, why in schema.UNSUPPORTED.items():
        if prefix.endswith(".") and key.startswith(prefix):
            return why
    return None


def parse(schema: type[M], conf: Mapping[str, Any]) -> M:
    """Validate `conf` (Kafka key -> value) against `schema`; return the schema
    instance with every key resolved (defaults filled). None values count as unset.

    Raises schema.ERROR (a ConfigurationError, a ValueError) naming the key, the value and
    what is allowed: for a key the role does not know (with the closest known key,
    e.g. `group_id` -> `group.id`), for a key Exactly deliberately does not support
    (with the reason), for a value of the wrong type or out of range, and for a
    missing required key."""
    known = set(keys(schema))
    given: dict[str, Any] = {}
    for raw_key, value in conf.items():
        key = str(raw_key)
        why = _unsupported(schema, key)
        if why is not None:
            raise schema.ERROR(f"{key} is not supported by Exactly's {schema.ROLE}: {why}",
                                     key=key, value=value, allowed="not supported")
        if key not in known:
            hint = _hint(schema, key, known)
            raise schema.ERROR(f"unknown configuration key {key!r} for the {schema.ROLE}{hint}",
                                     key=key, value=value, allowed=f"the {schema.ROLE} keys")
        if value is not None:
            given[key] = value
    try:
        return schema.model_validate(given)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else "?"
        if err["type"] == "missing":
            raise schema.ERROR(f"{key} is required for the {schema.ROLE}", key=key,
                                     allowed=allowed(schema, key) if key in known else None) from None
        what = allowed(schema, key) if key in known else ""
        value = given.get(key, err.get("input"))
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        raise schema.ERROR(f"{key}={value!r} is invalid for the {schema.ROLE}: {msg} (allowed: {what})",
                                 key=key, value=value, allowed=what) from None


def _hint(schema: type[ConfigSchema], key: str, known: set[str]) -> str:
    """The closest key of this role, or the other roles that have the key."""
    normalized = key.replace("_", ".").lower()
    guess = difflib.get_close_matches(normalized, sorted(known), n=1, cutoff=0.75)
    if guess and guess[0] != key:
        return f"; did you mean {guess[0]!r}?"
    others = sorted({s.ROLE for s in _ROLES if s.ROLE != schema.ROLE and normalized in keys(s)})
    if others:
        return f"; {normalized!r} is a setting of the {' and the '.join(others)}, not of the {schema.ROLE}"
    return ""


def markdown_table(schema: type[ConfigSchema]) -> str:
    """The reference table of `schema` as GitHub markdown: key, type / allowed
    values, default, importance, description (one row per key, definition order)."""
    rows = ["| key | allowed | default | importance | description |", "|---|---|---|---|---|"]
    for key in keys(schema):
        info = schema.model_fields[_field_by_key(schema)[key]]
        default = "(required)" if info.is_required() else _show(info.default)
        importance = (info.json_schema_extra or {}).get("importance", MEDIUM)
        rows.append(f"| `{key}` | {allowed(schema, key)} | {default} | {importance} | {info.description} |")
    for key, why in schema.UNSUPPORTED.items():
        shown = f"`{key}*`" if key.endswith(".") else f"`{key}`"
        rows.append(f"| {shown} | not supported | | | {why} |")
    return "\n".join(rows)


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    return f"`{value}`"


__all__ = ["ConfigurationError", "ConfigSchema", "Bool", "setting", "parse", "keys", "allowed", "markdown_table",
           "HIGH", "MEDIUM", "LOW"]
