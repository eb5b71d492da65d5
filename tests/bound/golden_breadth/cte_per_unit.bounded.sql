WITH _rows AS (
  SELECT
    "user_id" AS _u,
    TRY(TRY_CAST(LEAST("n", 5) AS DOUBLE)) AS _x0,
    "a" AS _x1
  FROM (
    SELECT
      _g0 AS "user_id",
      _v0 AS "n",
      _v1 AS "a"
    FROM (
      SELECT
        "user_id" AS _g0,
        COUNT(*) AS _v0,
        FAVG("spend") AS _v1
      FROM "visits" AS _s
      GROUP BY
        _g0
    ) AS _p
  ) AS _src
), _vals AS (
  SELECT
    _u,
    CASE
      WHEN _x0 IS NULL OR ISNAN(_x0)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x0 * 1, 0), 5)) AS BIGINT)
    END AS _v0,
    CASE
      WHEN _x1 IS NULL OR ISNAN(_x1)
      THEN NULL
      ELSE CAST(ROUND(LEAST(GREATEST(_x1 * 8192, 0), 1638400)) AS BIGINT)
    END AS _v1
  FROM _rows
), _capped AS (
  SELECT
    _u,
    1 AS _c,
    CASE WHEN _v0 IS NULL THEN 0 ELSE 1 END AS _c0,
    CAST(COALESCE(_v0, 0) AS INT128) AS _t0,
    CASE WHEN _v1 IS NULL THEN 0 ELSE 1 END AS _c1,
    CAST(COALESCE(_v1, 0) AS INT128) AS _t1
  FROM _vals
), _agg AS (
  SELECT
    SUM(_c) AS _m0,
    SUM(_t0) AS _m1,
    SUM(2 * _t1 - _c1 * CAST(1638400 AS INT128)) AS _m2,
    SUM(_c1) AS _m3,
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _agg._m0,
  _agg._m1,
  _agg._m2,
  _agg._m3
FROM _agg
