WITH _rows AS (
  SELECT
    "_dpsql_unit" AS _u,
    "x" AS _x0
  FROM (
    (
      (
        SELECT
          "x" AS "x",
          "_dpsql_unit" AS "_dpsql_unit"
        FROM (
          SELECT
            "spend" AS "x",
            "user_id" AS "_dpsql_unit"
          FROM "visits" AS _s
        ) AS _b
      )
      UNION ALL
      (
        SELECT
          "amount" AS "x",
          "_dpsql_unit" AS "_dpsql_unit"
        FROM (
          SELECT
            "amount" AS "amount",
            "user_id" AS "_dpsql_unit"
          FROM "purchases" AS _s
        ) AS _b
      )
    )
    UNION ALL
    (
      SELECT
        "price" AS "x",
        "_dpsql_unit" AS "_dpsql_unit"
      FROM (
        SELECT
          "price" AS "price",
          "_dpsql_unit" AS "_dpsql_unit"
        FROM (
          SELECT
            "_r0"."basket_id",
            "_r0"."product",
            "_r0"."price",
            "_r2"."user_id" AS "_dpsql_unit"
          FROM "lines" AS "_r0"
          JOIN "baskets" AS "_r1"
            ON "_r0"."basket_id" = "_r1"."basket_id"
          JOIN "people" AS "_r2"
            ON "_r1"."user_id" = "_r2"."user_id"
        ) AS _s
      ) AS _b
    )
  ) AS _src
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
    END AS _t0
  FROM _kept
), _agg AS (
  SELECT
    SUM(_c) AS _m0,
    SUM(_t0) AS _m1,
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _agg._m0,
  _agg._m1
FROM _agg
