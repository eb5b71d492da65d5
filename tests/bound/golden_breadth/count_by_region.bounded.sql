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
    "age" AS _x0
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
), _pivot AS (
  SELECT
    _u,
    COUNT(CASE WHEN _k0 IS NOT DISTINCT FROM CAST('central' AS TEXT) THEN 1 END) AS _n__0,
    COUNT(CASE WHEN _k0 IS NOT DISTINCT FROM CAST('central' AS TEXT) THEN _v0 END) AS _n0__0,
    HASH(_u, CAST('central' AS TEXT), CAST($salt AS BIGINT)) AS _h__0,
    COUNT(CASE WHEN _k0 IS NOT DISTINCT FROM CAST('east' AS TEXT) THEN 1 END) AS _n__1,
    COUNT(CASE WHEN _k0 IS NOT DISTINCT FROM CAST('east' AS TEXT) THEN _v0 END) AS _n0__1,
    HASH(_u, CAST('east' AS TEXT), CAST($salt AS BIGINT)) AS _h__1,
    COUNT(CASE WHEN _k0 IS NOT DISTINCT FROM CAST('north' AS TEXT) THEN 1 END) AS _n__2,
    COUNT(CASE WHEN _k0 IS NOT DISTINCT FROM CAST('north' AS TEXT) THEN _v0 END) AS _n0__2,
    HASH(_u, CAST('north' AS TEXT), CAST($salt AS BIGINT)) AS _h__2,
    COUNT(CASE WHEN _k0 IS NOT DISTINCT FROM CAST('south' AS TEXT) THEN 1 END) AS _n__3,
    COUNT(CASE WHEN _k0 IS NOT DISTINCT FROM CAST('south' AS TEXT) THEN _v0 END) AS _n0__3,
    HASH(_u, CAST('south' AS TEXT), CAST($salt AS BIGINT)) AS _h__3,
    COUNT(CASE WHEN _k0 IS NOT DISTINCT FROM CAST('west' AS TEXT) THEN 1 END) AS _n__4,
    COUNT(CASE WHEN _k0 IS NOT DISTINCT FROM CAST('west' AS TEXT) THEN _v0 END) AS _n0__4,
    HASH(_u, CAST('west' AS TEXT), CAST($salt AS BIGINT)) AS _h__4
  FROM _vals
  GROUP BY
    _u
), _kept AS (
  SELECT
    _pivot._u,
    _d._k0,
    CASE
      WHEN _d._j = 0
      THEN _n__0
      WHEN _d._j = 1
      THEN _n__1
      WHEN _d._j = 2
      THEN _n__2
      WHEN _d._j = 3
      THEN _n__3
      WHEN _d._j = 4
      THEN _n__4
    END AS _n,
    CASE
      WHEN _d._j = 0
      THEN _n0__0
      WHEN _d._j = 1
      THEN _n0__1
      WHEN _d._j = 2
      THEN _n0__2
      WHEN _d._j = 3
      THEN _n0__3
      WHEN _d._j = 4
      THEN _n0__4
    END AS _n0
  FROM _pivot
  CROSS JOIN (VALUES
    (0, CAST('central' AS TEXT)),
    (1, CAST('east' AS TEXT)),
    (2, CAST('north' AS TEXT)),
    (3, CAST('south' AS TEXT)),
    (4, CAST('west' AS TEXT))) AS _d(_j, _k0)
  WHERE
    CASE
      WHEN _d._j = 0
      THEN _n__0 > 0
      AND CASE WHEN _n__1 > 0 AND _h__1 < _h__0 THEN 1 ELSE 0 END + CASE WHEN _n__2 > 0 AND _h__2 < _h__0 THEN 1 ELSE 0 END + CASE WHEN _n__3 > 0 AND _h__3 < _h__0 THEN 1 ELSE 0 END + CASE WHEN _n__4 > 0 AND _h__4 < _h__0 THEN 1 ELSE 0 END < 2
      WHEN _d._j = 1
      THEN _n__1 > 0
      AND CASE WHEN _n__0 > 0 AND _h__0 <= _h__1 THEN 1 ELSE 0 END + CASE WHEN _n__2 > 0 AND _h__2 < _h__1 THEN 1 ELSE 0 END + CASE WHEN _n__3 > 0 AND _h__3 < _h__1 THEN 1 ELSE 0 END + CASE WHEN _n__4 > 0 AND _h__4 < _h__1 THEN 1 ELSE 0 END < 2
      WHEN _d._j = 2
      THEN _n__2 > 0
      AND CASE WHEN _n__0 > 0 AND _h__0 <= _h__2 THEN 1 ELSE 0 END + CASE WHEN _n__1 > 0 AND _h__1 <= _h__2 THEN 1 ELSE 0 END + CASE WHEN _n__3 > 0 AND _h__3 < _h__2 THEN 1 ELSE 0 END + CASE WHEN _n__4 > 0 AND _h__4 < _h__2 THEN 1 ELSE 0 END < 2
      WHEN _d._j = 3
      THEN _n__3 > 0
      AND CASE WHEN _n__0 > 0 AND _h__0 <= _h__3 THEN 1 ELSE 0 END + CASE WHEN _n__1 > 0 AND _h__1 <= _h__3 THEN 1 ELSE 0 END + CASE WHEN _n__2 > 0 AND _h__2 <= _h__3 THEN 1 ELSE 0 END + CASE WHEN _n__4 > 0 AND _h__4 < _h__3 THEN 1 ELSE 0 END < 2
      WHEN _d._j = 4
      THEN _n__4 > 0
      AND CASE WHEN _n__0 > 0 AND _h__0 <= _h__4 THEN 1 ELSE 0 END + CASE WHEN _n__1 > 0 AND _h__1 <= _h__4 THEN 1 ELSE 0 END + CASE WHEN _n__2 > 0 AND _h__2 <= _h__4 THEN 1 ELSE 0 END + CASE WHEN _n__3 > 0 AND _h__3 <= _h__4 THEN 1 ELSE 0 END < 2
    END
), _capped AS (
  SELECT
    _k0,
    LEAST(_n, 3) AS _c,
    LEAST(_n0, 3) AS _c0
  FROM _kept
), _agg AS (
  SELECT
    _k0,
    CAST(SUM(_c) AS BIGINT) AS _m0,
    CAST(SUM(_c0) AS BIGINT) AS _m1,
    COUNT(*) AS _m2,
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
    _agg._m2
  FROM _agg
) AS _f
  ON _d._k0 IS NOT DISTINCT FROM _f._k0
