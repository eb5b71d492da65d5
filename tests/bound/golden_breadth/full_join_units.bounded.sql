WITH _rows AS (
  SELECT
    "_dpsql_full_unit" AS _u,
    "spend" AS _x0,
    "amount" AS _x1
  FROM (
    SELECT
      "_j0"."user_id" AS "v_user_id",
      "_j0"."region" AS "region",
      "_j0"."age" AS "age",
      "_j0"."spend" AS "spend",
      "_j0"."day" AS "day",
      "_j0"."item" AS "item",
      "_j1"."user_id" AS "p_user_id",
      "_j1"."amount" AS "amount",
      COALESCE("_j0"."user_id", "_j1"."user_id") AS "_dpsql_full_unit"
    FROM "visits" AS "_j0"
    FULL JOIN "purchases" AS "_j1"
      ON "_j0"."user_id" = "_j1"."user_id"
  ) AS _src
), _vals AS (
  SELECT
    _u,
    CASE WHEN ISNAN(_x0) THEN NULL ELSE _x0 END AS _v0,
    CASE
      WHEN _x1 IS NULL OR ISNAN(_x1)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x1 * 16384, 0), 1638400)) AS BIGINT)
    END AS _v1
  FROM _rows
), _units AS (
  SELECT
    _u,
    COUNT(*) AS _n,
    COUNT(_v0) AS _n0,
    COUNT(_v1) AS _n1,
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
    LEAST(_n, 3) AS _c,
    LEAST(_n0, 3) AS _c0,
    LEAST(_n1, 3) AS _c1,
    CASE
      WHEN _n1 <= 3
      THEN CAST(_s1 AS INT128)
      ELSE LEAST(
        GREATEST(
          (
            3 * (
              CAST(_s1 AS INT128) // CAST(_n1 AS INT128) - CASE WHEN CAST(_s1 AS INT128) % CAST(_n1 AS INT128) < 0 THEN 1 ELSE 0 END
            ) + (
              2 * 3 * (
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
        CAST(4915200 AS INT128)
      )
    END AS _t1
  FROM _kept
), _agg AS (
  SELECT
    SUM(_c) AS _m0,
    SUM(_c0) AS _m1,
    SUM(_t1) AS _m2,
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _agg._m0,
  _agg._m1,
  _agg._m2
FROM _agg
