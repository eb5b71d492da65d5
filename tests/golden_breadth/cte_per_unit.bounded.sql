WITH _rows AS (
  SELECT
    "user_id" AS _u,
    TRY(TRY_CAST(LEAST("n", 5) AS DOUBLE)) AS _x0,
    "a" AS _x1
  FROM (
    SELECT
      _g0 AS "user_id",
      _v0 AS "n",
      _v1 AS "a"
    FROM (
      SELECT
        "user_id" AS _g0,
        COUNT(*) AS _v0,
        FAVG("spend") AS _v1
      FROM "visits" AS _s
      GROUP BY
        _g0
    ) AS _p
  ) AS _src
), _vals AS (
  SELECT
    _u,
    CASE
      WHEN _x0 IS NULL OR ISNAN(_x0)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x0 * 1, 0), 5)) AS BIGINT)
    END AS _v0,
    CASE
      WHEN _x1 IS NULL OR ISNAN(_x1)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x1 * 8192, 0), 1638400)) AS BIGINT)
    END AS _v1
  FROM _rows
), _units AS (
  SELECT
    _u,
    COUNT(*) AS _n,
    COUNT(_v0) AS _n0,
    COUNT(_v1) AS _n1,
    COALESCE(SUM(_v0), 0) AS _s0,
    COALESCE(SUM(_v1), 0) AS _s1
  FROM _vals
  GROUP BY
    _u
), _kept AS (
  SELECT
    *
  FROM _units
), _capped AS (
  SELECT
    LEAST(_n, 1) AS _c,
    LEAST(_n0, 1) AS _c0,
    LEAST(_n1, 1) AS _c1,
    CASE
      WHEN _n0 <= 1
      THEN CAST(_s0 AS INT128)
      ELSE LEAST(
        GREATEST(
          (
            1 * (
              CAST(_s0 AS INT128) // CAST(_n0 AS INT128) - CASE WHEN CAST(_s0 AS INT128) % CAST(_n0 AS INT128) < 0 THEN 1 ELSE 0 END
            ) + (
              2 * 1 * (
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
        CAST(5 AS INT128)
      )
    END AS _t0,
    CASE
      WHEN _n1 <= 1
      THEN CAST(_s1 AS INT128)
      ELSE LEAST(
        GREATEST(
          (
            1 * (
              CAST(_s1 AS INT128) // CAST(_n1 AS INT128) - CASE WHEN CAST(_s1 AS INT128) % CAST(_n1 AS INT128) < 0 THEN 1 ELSE 0 END
            ) + (
              2 * 1 * (
                CAST(_s1 AS INT128) - (
                  CAST(_s1 AS INT128) // CAST(_n1 AS INT128) - CASE WHEN CAST(_s1 AS INT128) % CAST(_n1 AS INT128) < 0 THEN 1 ELSE 0 END
                ) * CAST(_n1 AS INT128)
              ) + CAST(_n1 AS INT128)
            ) // (
              2 * CAST(_n1 AS INT128)
            )
          ),
          CAST(0 AS INT128)
        ),
        CAST(1638400 AS INT128)
      )
    END AS _t1
  FROM _kept
), _agg AS (
  SELECT
    SUM(_c) AS _m0,
    SUM(_t0) AS _m1,
    SUM(2 * _t1 - _c1 * CAST(1638400 AS INT128)) AS _m2,
    SUM(_c1) AS _m3,
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _agg._m0,
  _agg._m1,
  _agg._m2,
  _agg._m3
FROM _agg
