WITH _dom0 AS (
  SELECT
    *
  FROM (VALUES
    (CAST('a' AS TEXT)),
    (CAST('b' AS TEXT)),
    (CAST('c' AS TEXT))) AS _l(_k0)
), _rows AS (
  SELECT
    "_dpsql_l_dpsql_unit" AS _u,
    "segment" AS _k0,
    "price" AS _x0
  FROM (
    SELECT
      "_j0"."basket_id" AS "l_basket_id",
      "_j0"."product" AS "product",
      "_j0"."price" AS "price",
      "_j2"."user_id" AS "_dpsql_l_dpsql_unit",
      "_j1"."basket_id" AS "b_basket_id",
      "_j1"."user_id" AS "b_user_id",
      "_j1"."channel" AS "channel",
      "_j2"."user_id" AS "_dpsql_b_dpsql_unit",
      "_j2"."user_id" AS "p_user_id",
      "_j2"."segment" AS "segment"
    FROM "lines" AS "_j0"
    JOIN "baskets" AS "_j1"
      ON "_j0"."basket_id" = "_j1"."basket_id"
    JOIN "people" AS "_j2"
      ON "_j1"."user_id" = "_j2"."user_id"
  ) AS _src
  WHERE
    "segment" IN (
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
      ELSE CAST(ROUND(LEAST(GREATEST(_x0 * 32768, 0), 1638400)) AS BIGINT)
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
