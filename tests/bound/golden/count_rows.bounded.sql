WITH _rows AS (
  SELECT
    "user_id" AS _u
  FROM "visits"
), _vals AS (
  SELECT
    _u
  FROM _rows
), _units AS (
  SELECT
    _u,
    COUNT(*) AS _n
  FROM _vals
  GROUP BY
    _u
), _kept AS (
  SELECT
    *
  FROM _units
), _capped AS (
  SELECT
    LEAST(_n, 10) AS _c
  FROM _kept
), _agg AS (
  SELECT
    CAST(SUM(_c) AS BIGINT) AS _m0,
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _agg._m0
FROM _agg
