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
    "user_id" AS _u,
    "region" AS _k0,
    "spend" AS _x0,
    CAST("age" AS DOUBLE) AS _x1
  FROM "visits"
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
      ELSE CAST(ROUND(LEAST(GREATEST(_x0 * 8, 0), 1600)) AS BIGINT)
    END AS _v0,
    CASE
      WHEN _x1 IS NULL OR ISNAN(_x1)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x1 * 1, 18), 90)) AS BIGINT)
    END AS _v1
  FROM _rows
), _units AS (
  SELECT
    _u,
    _k0,
    COUNT(*) AS _n,
    ARRAY_AGG(_v0) FILTER(WHERE
      NOT _v0 IS NULL) AS _l0,
    ARRAY_AGG(_v1) FILTER(WHERE
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
    CASE
      WHEN LENGTH(_l0) <= 3
      THEN _l0
      ELSE LIST_SLICE(LIST_SORT(_l0), 1, LENGTH(_l0), GREATEST((
        LENGTH(_l0) + 2
      ) // 3, 1))
    END AS _l0,
    CASE
      WHEN LENGTH(_l1) <= 3
      THEN _l1
      ELSE LIST_SLICE(LIST_SORT(_l1), 1, LENGTH(_l1), GREATEST((
        LENGTH(_l1) + 2
      ) // 3, 1))
    END AS _l1
  FROM _kept
), _x0 AS (
  SELECT
    _k0,
    HISTOGRAM(_b) AS _h
  FROM (
    SELECT
      _k0,
      UNNEST(_l0) AS _b
    FROM _capped
  )
  GROUP BY
    _k0
), _x6 AS (
  SELECT
    _k0,
    HISTOGRAM(_b) AS _h
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
    COUNT(*) AS _z
  FROM _capped
  GROUP BY
    _k0
)
SELECT
  _d._k0 AS _k0,
  _f._m0 AS _m0,
  _f._m1 AS _m1,
  _f._m2 AS _m2,
  _f._m3 AS _m3,
  _f._m4 AS _m4,
  _f._m5 AS _m5,
  _f._m6 AS _m6,
  _f._m7 AS _m7,
  _f._m8 AS _m8,
  _f._m9 AS _m9
FROM (
  SELECT
    *
  FROM _dom0
) AS _d
LEFT JOIN (
  SELECT
    _agg._k0,
    _x0._h AS _m0,
    _x0._h AS _m1,
    _x0._h AS _m2,
    _x0._h AS _m3,
    _x0._h AS _m4,
    _x0._h AS _m5,
    _x6._h AS _m6,
    _x6._h AS _m7,
    _x6._h AS _m8,
    _x6._h AS _m9
  FROM _agg
  LEFT JOIN _x0
    ON _agg._k0 IS NOT DISTINCT FROM _x0._k0
  LEFT JOIN _x6
    ON _agg._k0 IS NOT DISTINCT FROM _x6._k0
) AS _f
  ON _d._k0 IS NOT DISTINCT FROM _f._k0
