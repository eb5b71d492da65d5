WITH _dom0 AS (
  SELECT
    *
  FROM (VALUES
    (CAST('central' AS TEXT)),
    (CAST('east' AS TEXT)),
    (CAST('north' AS TEXT)),
    (CAST('south' AS TEXT)),
    (CAST('west' AS TEXT))) AS _l(_k0)
), _all AS (
  SELECT
    "user_id" AS _u,
    "region" AS _k0,
    "spend" AS _x0
  FROM "visits"
  WHERE
    "region" IN (
      SELECT
        _k0
      FROM _dom0
    )
), _heavy AS (
  SELECT
    _u
  FROM _all
  GROUP BY
    _u
  HAVING
    COUNT(*) > 2
), _rows AS (
  SELECT
    *
  FROM _all
  ANTI JOIN _heavy
    ON _all._u IS NOT DISTINCT FROM _heavy._u
  UNION ALL
  SELECT
    *
  FROM (
    SELECT
      _all.*
    FROM _all
    SEMI JOIN _heavy
      ON _all._u IS NOT DISTINCT FROM _heavy._u
  )
  QUALIFY
    ROW_NUMBER() OVER (PARTITION BY _u ORDER BY HASH(_u, _k0, _x0, CAST($salt AS BIGINT)), _k0, _x0) <= 2
), _vals AS (
  SELECT
    _u,
    _k0,
    CASE
      WHEN _x0 IS NULL OR ISNAN(_x0)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x0 * 8192, 0), 1638400)) AS BIGINT)
    END AS _v0
  FROM _rows
), _capped AS (
  SELECT
    _u,
    _k0,
    1 AS _c,
    CASE WHEN _v0 IS NULL THEN 0 ELSE 1 END AS _c0,
    CAST(COALESCE(_v0, 0) AS INT128) AS _t0
  FROM _vals
), _agg AS (
  SELECT
    _k0,
    CAST(SUM(_c) AS BIGINT) AS _m0,
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
