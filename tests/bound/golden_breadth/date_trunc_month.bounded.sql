WITH _dom0 AS (
  SELECT
    *
  FROM (VALUES
    (CAST('2024-01-01 00:00:00' AS TIMESTAMP)),
    (CAST('2024-02-01 00:00:00' AS TIMESTAMP)),
    (CAST('2024-03-01 00:00:00' AS TIMESTAMP)),
    (CAST('2024-04-01 00:00:00' AS TIMESTAMP)),
    (CAST('2024-05-01 00:00:00' AS TIMESTAMP)),
    (CAST('2024-06-01 00:00:00' AS TIMESTAMP)),
    (CAST('2024-07-01 00:00:00' AS TIMESTAMP)),
    (CAST('2024-08-01 00:00:00' AS TIMESTAMP)),
    (CAST('2024-09-01 00:00:00' AS TIMESTAMP)),
    (CAST('2024-10-01 00:00:00' AS TIMESTAMP)),
    (CAST('2024-11-01 00:00:00' AS TIMESTAMP)),
    (CAST('2024-12-01 00:00:00' AS TIMESTAMP))) AS _l(_k0)
), _rows AS (
  SELECT
    "user_id" AS _u,
    TRY(DATE_TRUNC('MONTH', "day")) AS _k0
  FROM "visits"
  WHERE
    TRY(DATE_TRUNC('MONTH', "day")) IN (
      SELECT
        _k0
      FROM _dom0
    )
), _vals AS (
  SELECT
    _u,
    _k0
  FROM _rows
), _units AS (
  SELECT
    _u,
    _k0,
    COUNT(*) AS _n
  FROM _vals
  GROUP BY
    _u,
    _k0
), _kept AS (
  SELECT
    *
  FROM _units
  QUALIFY
    ROW_NUMBER() OVER (PARTITION BY _u ORDER BY HASH(_u, _k0, CAST($salt AS BIGINT))) <= 2
), _capped AS (
  SELECT
    _k0,
    LEAST(_n, 3) AS _c
  FROM _kept
), _agg AS (
  SELECT
    _k0,
    CAST(SUM(_c) AS BIGINT) AS _m0,
    COUNT(*) AS _z
  FROM _capped
  GROUP BY
    _k0
)
SELECT
  _d._k0 AS _k0,
  COALESCE(_f._m0, 0) AS _m0
FROM (
  SELECT
    *
  FROM _dom0
) AS _d
LEFT JOIN (
  SELECT
    _agg._k0,
    _agg._m0
  FROM _agg
) AS _f
  ON _d._k0 IS NOT DISTINCT FROM _f._k0
