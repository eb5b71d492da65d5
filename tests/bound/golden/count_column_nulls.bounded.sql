WITH _rows AS (
  SELECT
    "user_id" AS _u,
    "spend" AS _x0
  FROM "visits"
), _vals AS (
  SELECT
    _u,
    CASE WHEN ISNAN(_x0) THEN NULL ELSE _x0 END AS _v0
  FROM _rows
), _units AS (
  SELECT
    _u,
    COUNT(*) AS _n,
    COUNT(_v0) AS _n0
  FROM _vals
  GROUP BY
    _u
), _kept AS (
  SELECT
    *
  FROM _units
), _capped AS (
  SELECT
    LEAST(_n, 10) AS _c,
    LEAST(_n0, 10) AS _c0
  FROM _kept
), _agg AS (
  SELECT
    CAST(SUM(_c0) AS BIGINT) AS _m0,
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _agg._m0
FROM _agg
