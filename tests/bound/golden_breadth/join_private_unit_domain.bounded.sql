WITH _dom0 AS (
  SELECT
    *
  FROM (VALUES
    (CAST('central' AS TEXT)),
    (CAST('east' AS TEXT)),
    (CAST('north' AS TEXT)),
    (CAST('south' AS TEXT)),
    (CAST('west' AS TEXT))) AS _l(_k0)
), _rows AS (
  SELECT
    "visits_user_id" AS _u,
    "region" AS _k0,
    "amount" AS _x0
  FROM (
    SELECT
      "_j0"."user_id" AS "visits_user_id",
      "_j0"."region" AS "region",
      "_j0"."age" AS "age",
      "_j0"."spend" AS "spend",
      "_j0"."day" AS "day",
      "_j0"."item" AS "item",
      "_j1"."user_id" AS "purchases_user_id",
      "_j1"."amount" AS "amount"
    FROM "visits" AS "_j0"
    JOIN "purchases" AS "_j1"
      ON "_j0"."user_id" = "_j1"."user_id"
  ) AS _src
  WHERE
    "region" IN (
      SELECT
        _k0
      FROM _dom0
    )
), _vals AS (
  SELECT
    _u,
    _k0,
    CASE
      WHEN _x0 IS NULL OR ISNAN(_x0)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x0 * 16384, 0), 1638400)) AS BIGINT)
    END AS _v0
  FROM _rows
), _units AS (
  SELECT
    _u,
    _k0,
    COUNT(*) AS _n,
    COUNT(_v0) AS _n0,
    COALESCE(SUM(_v0), 0) AS _s0
  FROM _vals
  GROUP BY
    _u,
    _k0
), _multi AS (
  SELECT
    _u
  FROM _units
  GROUP BY
    _u
  HAVING
    COUNT(*) > 2
), _kept AS (
  SELECT
    *
  FROM _units
  ANTI JOIN _multi
    ON _units._u IS NOT DISTINCT FROM _multi._u
  UNION ALL
  SELECT
    *
  FROM (
    SELECT
      _units.*
    FROM _units
    SEMI JOIN _multi
      ON _units._u IS NOT DISTINCT FROM _multi._u
  )
  QUALIFY
    ROW_NUMBER() OVER (PARTITION BY _u ORDER BY HASH(_u, _k0, CAST($salt AS BIGINT))) <= 2
), _capped AS (
  SELECT
    _k0,
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
    _k0,
    SUM(_c) AS _m0,
    SUM(_t0) AS _m1,
    COUNT(*) AS _z
  FROM _capped
  GROUP BY
    _k0
)
SELECT
  _d._k0 AS _k0,
  COALESCE(_f._m0, 0) AS _m0,
  COALESCE(_f._m1, 0) AS _m1
FROM (
  SELECT
    *
  FROM _dom0
) AS _d
LEFT JOIN (
  SELECT
    _agg._k0,
    _agg._m0,
    _agg._m1
  FROM _agg
) AS _f
  ON _d._k0 IS NOT DISTINCT FROM _f._k0
