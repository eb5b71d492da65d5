"""Loading a policy: a TOML file (see ``docs/policy.md``) or a dict, validated into a ``Policy``.

The file is read with a size cap (``read_limited``, which other inputs use too), and TOML floats
are read as ``Decimal`` so that ``0.01`` is exactly 1/100; a validation error becomes a
``PolicyError`` that names each field at fault (``_describe``).
"""

from __future__ import annotations

import re
import tomllib
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from dpsql.errors import DpsqlError, InputError, PolicyError
from dpsql.policy.schema import did_you_mean
from dpsql.policy.spec import Policy

__all__ = ["MAX_POLICY_BYTES", "MAX_POLICY_DEPTH", "load_policy", "read_limited"]


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "policy"
        if item["type"] == "extra_forbidden" and item["loc"]:
            # An unknown key: named, with the closest key the policy knows at that level.
            key = str(item["loc"][-1])
            hint = did_you_mean(key, _known_keys(item["loc"][:-1]))
            parts.append(f"{where}: unknown key {key}{hint}")
            continue
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def _known_keys(path: tuple[int | str, ...]) -> list[str]:
    """The keys the policy's model accepts at ``path`` (its field names and aliases), walking
    the model's fields, dictionaries' values and optional types; none where it is unknown."""
    node: Any = Policy
    for part in path:
        node = _model_in(node)
        if node is None:
            return []
        if isinstance(node, dict):  # a dict[str, Model]'s key: the value's model
            node = node["value"]
            continue
        field = node.model_fields.get(str(part))
        if field is None:
            return []
        node = field.annotation
    model = _model_in(node)
    if model is None or isinstance(model, dict):
        return []
    names = set(model.model_fields)
    names |= {f.alias for f in model.model_fields.values() if f.alias}
    return sorted(names)


def _model_in(annotation: Any) -> Any:
    """The pydantic model an annotation holds (through ``X | None``), or {"value": V} for a
    ``dict[str, V]``, else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is dict and len(args) == 2:
        return {"value": args[1]}
    for arg in args:
        found = _model_in(arg)
        if found is not None:
            return found
    return None


# A policy is a page of TOML; a megabyte of it is a mistake, or an attempt to exhaust memory.
MAX_POLICY_BYTES = 1 << 20


def read_limited(
    source: Path | IO[bytes], limit: int, what: str, error: type[DpsqlError] = InputError
) -> str:
    """The UTF-8 text of a file (or a binary stream such as standard input), reading at most
    ``limit + 1`` bytes: a FIFO, ``/dev/zero`` or a huge file cannot exhaust memory.

    ``what`` names the input in the messages of ``error`` ("the policy file p.toml"), which
    never quote its content.
    """
    try:
        if isinstance(source, Path):
            with source.open("rb") as handle:
                data = handle.read(limit + 1)
        else:
            data = source.read(limit + 1)
    except OSError:
        raise error(f"cannot read {what}") from None
    if len(data) > limit:
        raise error(f"{what} is larger than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not UTF-8 text (byte {exc.start} is invalid)") from None


# The deepest policy field is a few tables down (tables.<t>.columns.<c>.bounds); 32 levels of
# tables and arrays are far past it, and well short of Python's recursion limit.
MAX_POLICY_DEPTH = 32
_TOO_DEEP = f"the policy file nests tables or arrays more than {MAX_POLICY_DEPTH} levels deep"


# tomllib keeps a record for every prefix of a dotted key, so one key of n parts costs memory
# quadratic in n (8,000 parts: 265 MB): a long dotted key is refused on the text, before parsing.
_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""
_TOKEN = re.compile(
    # Multi-line strings first (a dotted run inside one is text), then runs of dotted key parts,
    # then the other strings and comments, so that each is consumed whole.
    r'"""(?:[^\\]|\\.)*?"""' + r"|'''.*?'''"
    rf"|(?P<key>{_PART}(?:[ \t]*\.[ \t]*{_PART})+)"
    r"""|"(?:[^"\\\n]|\\.)*"|'[^'\n]*'|#[^\n]*""",
    re.DOTALL,
)
_PARTS = re.compile(_PART)


def _longest_dotted_key(text: str) -> int:
    """The most parts of any dotted key (or table header) in a TOML text."""
    runs = (m.group("key") for m in _TOKEN.finditer(text) if m.group("key"))
    return max((len(_PARTS.findall(run)) for run in runs), default=0)


def _depth(value: object) -> int:
    """How many levels of tables and arrays ``value`` nests, counted without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > MAX_POLICY_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((child, level + 1) for child in item)
    return deepest


def _tables_have_data(raw: dict[str, Any]) -> None:
    """A table under [tables] that [data] does not name is refused before anything else, with
    the closest name [data] has: its fields' errors would otherwise speak of something else.
    Only with files: a database or a Spark catalog holds tables the policy does not list."""
    data, tables = raw.get("data"), raw.get("tables")
    if not isinstance(data, dict) or not isinstance(tables, dict):
        return
    files, blocks = data.get("tables"), data.get("blocks")
    if data.get("database") is not None or data.get("catalog"):
        return
    if files is None and isinstance(blocks, dict) and blocks:
        files = {}  # only tables made of blocks
    if not isinstance(files, dict):
        return
    blocks = blocks if isinstance(blocks, dict) else {}
    known = [str(k) for k in (*files, *blocks)]
    lowered = {k.lower() for k in known}
    for name in tables:
        if str(name).lower() not in lowered:
            hint = did_you_mean(str(name), known)
            raise PolicyError(f"tables.{name}: data.tables names no such table{hint}")


def load_policy(source: str | Path | dict[str, Any], base_dir: Path | None = None) -> Policy:
    """Load and validate a policy from a TOML path or a dict; raises ``PolicyError``."""
    if isinstance(source, dict):
        raw = dict(source)
        base = base_dir or Path.cwd()
    elif isinstance(source, str | Path):
        path = Path(source)
        text = read_limited(path, MAX_POLICY_BYTES, f"the policy file {path}", PolicyError)
        if _longest_dotted_key(text) > MAX_POLICY_DEPTH:
            raise PolicyError(_TOO_DEEP)
        try:
            raw = tomllib.loads(text, parse_float=Decimal)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"the policy file is not valid TOML: {exc}") from None
        except ValueError:  # an integer of 4,300 digits or more, which int() refuses
            raise PolicyError("the policy file holds a number too long to read") from None
        except RecursionError:  # tomllib parses nested arrays and inline tables recursively
            raise PolicyError(_TOO_DEEP) from None
        base = base_dir or path.resolve().parent
    else:
        raise PolicyError("a policy is a TOML file's path, a Policy or a dict")
    if _depth(raw) > MAX_POLICY_DEPTH:
        raise PolicyError(_TOO_DEEP)
    _tables_have_data(raw)
    try:
        return Policy.model_validate({**raw, "base_dir": base})
    except ValidationError as exc:
        raise PolicyError(f"invalid policy: {_describe(exc)}") from None
