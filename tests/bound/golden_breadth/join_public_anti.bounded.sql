WITH _rows AS (
  SELECT
    "user_id" AS _u,
    CAST("age" AS DOUBLE) AS _x0
  FROM (
    SELECT
      "_j0"."user_id" AS "user_id",
      "_j0"."region" AS "region",
      "_j0"."age" AS "age",
      "_j0"."spend" AS "spend",
      "_j0"."day" AS "day",
      "_j0"."item" AS "item"
    FROM "visits" AS "_j0"
    ANTI JOIN "zones" AS "_j1"
      ON "_j0"."region" = "_j1"."region"
  ) AS _src
), _vals AS (
  SELECT
    _u,
    CASE
      WHEN _x0 IS NULL OR ISNAN(_x0)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x0 * 1, 18), 90)) AS BIGINT)
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
          CAST(54 AS INT128)
        ),
        CAST(270 AS INT128)
      )
    END AS _t0
  FROM _kept
), _agg AS (
  SELECT
    SUM(_c) AS _m0,
    SUM(2 * _t0 - _c0 * CAST(108 AS INT128)) AS _m1,
    SUM(_c0) AS _m2,
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _agg._m0,
  _agg._m1,
  _agg._m2
FROM _agg
