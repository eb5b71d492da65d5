"""Loading a policy: a TOML file (see ``docs/policy.md``) or a dict, validated into a ``Policy``.

The file is read with a size cap (``read_limited``, which other inputs use too), and TOML floats
are read as ``Decimal`` so that ``0.01`` is exactly 1/100; a validation error becomes a
``PolicyError`` that names each field at fault (``_describe``).
"""

from __future__ import annotations

import tomllib
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from dpsql.errors import DpsqlError, InputError, PolicyError
from dpsql.policy.spec import Policy

__all__ = ["MAX_POLICY_BYTES", "load_policy", "read_limited"]


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "policy"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


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


def load_policy(source: str | Path | dict[str, Any], base_dir: Path | None = None) -> Policy:
    """Load and validate a policy from a TOML path or a dict; raises ``PolicyError``."""
    if isinstance(source, dict):
        raw = dict(source)
        base = base_dir or Path.cwd()
    elif isinstance(source, str | Path):
        path = Path(source)
        text = read_limited(path, MAX_POLICY_BYTES, f"the policy file {path}", PolicyError)
        try:
            raw = tomllib.loads(text, parse_float=Decimal)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"the policy file is not valid TOML: {exc}") from None
        except ValueError:  # an integer of 4,300 digits or more, which int() refuses
            raise PolicyError("the policy file holds a number too long to read") from None
        base = base_dir or path.resolve().parent
    else:
        raise PolicyError("a policy is a TOML file's path, a Policy or a dict")
    try:
        return Policy.model_validate({**raw, "base_dir": base})
    except ValidationError as exc:
        raise PolicyError(f"invalid policy: {_describe(exc)}") from None
