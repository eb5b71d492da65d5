WITH _dom0 AS (
  SELECT
    *
  FROM (VALUES
    (CAST('p1' AS TEXT)),
    (CAST('p2' AS TEXT)),
    (CAST('p3' AS TEXT))) AS _l(_k0)
), _rows AS (
  SELECT
    "_dpsql_unit" AS _u,
    "product" AS _k0,
    "price" AS _x0,
    "basket_id" AS _x1
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
  ) AS _src
  WHERE
    "product" IN (
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
    END AS _v0,
    _x1 AS _v1
  FROM _rows
), _units AS (
  SELECT
    _u,
    _k0,
    COUNT(*) AS _n,
    COUNT(_v0) AS _n0,
    COALESCE(SUM(_v0), 0) AS _s0,
    ARRAY_AGG(DISTINCT _v1) FILTER(WHERE
      NOT _v1 IS NULL) AS _l1
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
    _k0,
    COUNT(DISTINCT _b) AS _h
  FROM (
    SELECT
      _k0,
      UNNEST(_l1) AS _b
    FROM _capped
  )
  GROUP BY
    _k0
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
  COALESCE(_f._m1, 0) AS _m1,
  COALESCE(_f._m2, 0) AS _m2
FROM (
  SELECT
    *
  FROM _dom0
) AS _d
LEFT JOIN (
  SELECT
    _agg._k0,
    _agg._m0,
    _agg._m1,
    _x2._h AS _m2
  FROM _agg
  LEFT JOIN _x2
    ON _agg._k0 IS NOT DISTINCT FROM _x2._k0
) AS _f
  ON _d._k0 IS NOT DISTINCT FROM _f._k0
