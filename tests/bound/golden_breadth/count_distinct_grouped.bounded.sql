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
    "item" AS _x0
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
    _x0 AS _v0
  FROM _rows
), _units AS (
  SELECT
    _u,
    _k0,
    COUNT(*) AS _n,
    ARRAY_AGG(DISTINCT _v0) FILTER(WHERE
      NOT _v0 IS NULL) AS _l0
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
    END AS _l0
  FROM _kept
), _x0 AS (
  SELECT
    _k0,
    COUNT(DISTINCT _b) AS _h
  FROM (
    SELECT
      _k0,
      UNNEST(_l0) AS _b
    FROM _capped
  )
  GROUP BY
    _k0
), _agg AS (
  SELECT
    _k0,
    COUNT(*) AS _m1,
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
    _x0._h AS _m0,
    _agg._m1
  FROM _agg
  LEFT JOIN _x0
    ON _agg._k0 IS NOT DISTINCT FROM _x0._k0
) AS _f
  ON _d._k0 IS NOT DISTINCT FROM _f._k0
