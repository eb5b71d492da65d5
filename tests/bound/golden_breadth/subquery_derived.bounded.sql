WITH _rows AS (
  SELECT
    "user_id" AS _u,
    "s2" AS _x0,
    "s2" AS _x1
  FROM (
    SELECT
      "user_id" AS "user_id",
      TRY("spend" * 2) AS "s2"
    FROM "visits" AS _s
    WHERE
      TRY(NOT "spend" IS NULL) IS TRUE
  ) AS _src
), _vals AS (
  SELECT
    _u,
    CASE
      WHEN _x0 IS NULL OR ISNAN(_x0)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x0 * 4096, 0), 1638400)) AS BIGINT)
    END AS _v0,
    CASE
      WHEN _x1 IS NULL OR ISNAN(_x1)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x1 * 4, 0), 1600)) AS BIGINT)
    END AS _v1
  FROM _rows
), _units AS (
  SELECT
    _u,
    COUNT(*) AS _n,
    COUNT(_v0) AS _n0,
    COALESCE(SUM(_v0), 0) AS _s0,
    ARRAY_AGG(_v1) FILTER(WHERE
      NOT _v1 IS NULL) AS _l1
  FROM _vals
  GROUP BY
    _u
), _kept AS (
  SELECT
    *
  FROM _units
), _capped AS (
  SELECT
    LEAST(_n, 3) AS _c,
    LEAST(_n0, 3) AS _c0,
    CASE
      WHEN _n0 <= 3
      THEN CAST(_s0 AS INT128)
      ELSE LEAST(
        GREATEST(
          (
            3 * (
              CAST(_s0 AS INT128) // CAST(_n0 AS INT128) - CASE WHEN CAST(_s0 AS INT128) % CAST(_n0 AS INT128) < 0 THEN 1 ELSE 0 END
            ) + (
              2 * 3 * (
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
        CAST(4915200 AS INT128)
      )
    END AS _t0,
    CASE
      WHEN LENGTH(_l1) <= 3
      THEN _l1
      ELSE LIST_SLICE(LIST_SORT(_l1), 1, LENGTH(_l1), GREATEST((
        LENGTH(_l1) + 2
      ) // 3, 1))
    END AS _l1
  FROM _kept
), _x2 AS (
  SELECT
    HISTOGRAM(_b) AS _h
  FROM (
    SELECT
      UNNEST(_l1) AS _b
    FROM _capped
  )
), _agg AS (
  SELECT
    SUM(_c) AS _m0,
    SUM(_t0) AS _m1,
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _agg._m0,
  _agg._m1,
  _x2._h AS _m2,
  _x2._h AS _m3
FROM _agg
LEFT JOIN _x2
  ON TRUE
