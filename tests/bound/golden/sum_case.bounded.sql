WITH _rows AS (
  SELECT
    "user_id" AS _u,
    TRY(
      TRY_CAST(CASE
        WHEN (
          CASE
            WHEN "age" IS NULL
            THEN NULL
            ELSE LEAST(GREATEST(TRY_CAST("age" AS DOUBLE), 18), 90)
          END
        ) > 30
        THEN (
          CASE
            WHEN "spend" IS NULL OR TRY_CAST(ISNAN("spend") AS BOOLEAN)
            THEN NULL
            ELSE LEAST(GREATEST(TRY_CAST("spend" AS DOUBLE), 0), 200)
          END
        )
        ELSE 0
      END AS DOUBLE)
    ) AS _x0
  FROM "visits"
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
    SUM(_t0) AS _m0,
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _agg._m0
FROM _agg
