WITH _rows AS (
  SELECT
    "user_id" AS _u,
    "spend" AS _x0
  FROM "visits"
  WHERE
    TRY("spend" * 2 > 20) IS TRUE AND TRY(CAST("age" AS INT128) + 1 >= 30) IS TRUE
), _vals AS (
  SELECT
    _u,
    CASE
      WHEN _x0 IS NULL OR ISNAN(_x0)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x0 * 8192, 0), 1638400)) AS BIGINT)
    END AS _v0
  FROM _rows
), _units AS (
  SELECT
    _u,
    COUNT(*) AS _n,
    COUNT(_v0) AS _n0,
    COALESCE(SUM(_v0), 0) AS _s0
  FROM _vals
  GROUP BY
    _u
), _kept AS (
  SELECT
    *
  FROM _units
), _capped AS (
  SELECT
    LEAST(_n, 10) AS _c,
    LEAST(_n0, 10) AS _c0,
    CASE
      WHEN _n0 <= 10
      THEN CAST(_s0 AS INT128)
      ELSE LEAST(
        GREATEST(
          (
            10 * (
              CAST(_s0 AS INT128) // CAST(_n0 AS INT128) - CASE WHEN CAST(_s0 AS INT128) % CAST(_n0 AS INT128) < 0 THEN 1 ELSE 0 END
            ) + (
              2 * 10 * (
                CAST(_s0 AS INT128) - (
                  CAST(_s0 AS INT128) // CAST(_n0 AS INT128) - CASE WHEN CAST(_s0 AS INT128) % CAST(_n0 AS INT128) < 0 THEN 1 ELSE 0 END
                ) * CAST(_n0 AS INT128)
              ) + CAST(_n0 AS INT128)
            ) // (
              2 * CAST(_n0 AS INT128)
            )
          ),
          CAST(0 AS INT128)
        ),
        CAST(16384000 AS INT128)
      )
    END AS _t0
  FROM _kept
), _agg AS (
  SELECT
    CAST(SUM(_c) AS BIGINT) AS _m0,
    SUM(_t0) AS _m1,
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _agg._m0,
  _agg._m1
FROM _agg
