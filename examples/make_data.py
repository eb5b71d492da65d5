"""Generate the deterministic synthetic `visits` table used by the demo, the docs and the tests.

Columns: user_id (the privacy unit), region, age, spend, day. Contributions are skewed like real
event logs: most users have 1-5 rows and a heavy tail has hundreds, so contribution bounds
matter. The generator is seeded so that every checkout gets the same file; this seed concerns
the example data only and has nothing to do with dpsql's noise, which has no seed.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import duckdb
import numpy as np

REGIONS = ("north", "south", "east", "west", "central")


def make_visits(n_users: int, seed: int = 20261129) -> dict[str, np.ndarray]:
    """Columns of the visits table, as numpy arrays (deterministic for a given seed)."""
    rng = np.random.default_rng(seed)
    # Rows per user: mostly 1-5; about 1% of users are heavy, with 50-800 rows.
    rows = rng.integers(1, 6, size=n_users)
    heavy = rng.random(n_users) < 0.01
    rows[heavy] = rng.integers(50, 801, size=int(heavy.sum()))
    user_ids = np.repeat(np.arange(1, n_users + 1, dtype=np.int64), rows)
    n = user_ids.size
    # A home region per user, visited most of the time; other regions sometimes.
    home = rng.choice(len(REGIONS), size=n_users, p=[0.3, 0.25, 0.2, 0.15, 0.1])
    region_idx = np.repeat(home, rows)
    away = rng.random(n) < 0.2
    region_idx[away] = rng.integers(0, len(REGIONS), size=int(away.sum()))
    age = np.repeat(rng.integers(18, 86, size=n_users), rows).astype(np.int32)
    # Spend: log-normal, a few large values well above any sensible clamp.
    spend = np.round(rng.lognormal(mean=3.0, sigma=1.0, size=n), 2)
    day_offset = rng.integers(0, 365, size=n)
    return {
        "user_id": user_ids,
        "region": np.array(REGIONS, dtype=object)[region_idx],
        "age": age,
        "spend": spend,
        "day_offset": day_offset,
    }


def write_visits(path: Path, n_users: int) -> int:
    """Write the visits table as Parquet; returns the number of rows."""
    cols = make_visits(n_users)
    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.register("src", {k: v for k, v in cols.items()})
    start = dt.date(2026, 1, 1).isoformat()
    con.execute(
        f"""COPY (SELECT user_id, region, age, spend,
                         DATE '{start}' + CAST(day_offset AS INTEGER) AS day
                  FROM src ORDER BY user_id, day)
            TO '{path}' (FORMAT PARQUET)"""
    )
    n = con.execute(f"SELECT COUNT(*) FROM read_parquet('{path}')").fetchone()
    con.close()
    return int(n[0]) if n else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    here = Path(__file__).resolve().parent
    parser.add_argument("--out", type=Path, default=here / "data" / "visits.parquet")
    parser.add_argument("--users", type=int, default=50_000)
    args = parser.parse_args()
    n = write_visits(args.out, args.users)
    print(f"wrote {n} rows for {args.users} users to {args.out}")


if __name__ == "__main__":
    main()
