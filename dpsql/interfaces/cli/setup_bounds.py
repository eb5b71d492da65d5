"""``dpsql init --estimate-bounds EPSILON``: the bounds a policy leaves unset, estimated once at
set-up from a stated part of the budget (``ESTIMATE BOUNDS``, docs/sql.md).

For each private table, in name order, the statements that fill what its policy leaves unset:

* ``ESTIMATE BOUNDS FOR t`` (R) when it declares neither R nor C;
* ``ESTIMATE BOUNDS FOR t GROUP BY`` its columns with a listed domain (``public_values``,
  ``public_values_from``), for L0 and C, when it declares no R and lacks L0 or C;
* ``ESTIMATE BOUNDS FOR t.c`` for each numeric column (not the unit) with no ``lower``/``upper``.

Each is aimed at queries at the target epsilon (``FOR EPSILON``) and charged an equal part of
the stated epsilon, as the owner; the estimates are recorded and later queries use them
(declared bounds always win).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from dpsql.analyze.scope import NUMERIC
from dpsql.policy import Policy
from dpsql.policy.numbers import decimal_text

__all__ = ["setup_statements"]


def _numeric(ctype: str) -> bool:
    return ctype.lower() in NUMERIC or ctype.lower().startswith("decimal")


def setup_statements(
    policy: Policy, catalog: Mapping[str, Mapping[str, str]], target: Fraction
) -> list[str]:
    """The ``ESTIMATE BOUNDS`` statements that fill the bounds ``policy`` leaves unset."""
    tail = f" FOR EPSILON {decimal_text(target)}"
    out = []
    for name in sorted(policy.tables):
        spec = policy.tables[name]
        if not spec.is_private or name not in catalog:
            continue
        capped = spec.max_rows_per_unit is not None
        if not capped and spec.max_rows_per_unit_per_group is None:
            out.append(f"ESTIMATE BOUNDS FOR {name}{tail}")
        keys = sorted(
            c
            for c, col in spec.columns.items()
            if col.public_values is not None or col.public_values_from is not None
        )
        lacking = spec.max_groups_per_unit is None or spec.max_rows_per_unit_per_group is None
        if keys and lacking and not capped:
            out.append(f"ESTIMATE BOUNDS FOR {name} GROUP BY {', '.join(keys)}{tail}")
        for column, ctype in sorted(catalog[name].items()):
            declared = spec.columns.get(column.lower())
            named = {spec.privacy_unit, *policy.path_columns(name)}
            if column.lower() in named or not _numeric(ctype):
                continue
            if declared is None or declared.bounds is None:
                out.append(f"ESTIMATE BOUNDS FOR {name}.{column.lower()}{tail}")
    return out
