WITH _rows AS (
  SELECT
    "user_id" AS _u,
    "item" AS _x0,
    "age" AS _x1
  FROM "visits"
), _vals AS (
  SELECT
    _u,
    _x0 AS _v0,
    _x1 AS _v1
  FROM _rows
), _units AS (
  SELECT
    _u,
    COUNT(*) AS _n,
    ARRAY_AGG(DISTINCT _v0) FILTER(WHERE
      NOT _v0 IS NULL) AS _l0,
    ARRAY_AGG(DISTINCT _v1) FILTER(WHERE
      NOT _v1 IS NULL) AS _l1
  FROM _vals
  GROUP BY
    _u
), _kept AS (
  SELECT
    *
  FROM _units
), _capped AS (
  SELECT
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
    COUNT(DISTINCT _b) AS _h
  FROM (
    SELECT
      UNNEST(_l0) AS _b
    FROM _capped
  )
), _x1 AS (
  SELECT
    COUNT(DISTINCT _b) AS _h
  FROM (
    SELECT
      UNNEST(_l1) AS _b
    FROM _capped
  )
), _agg AS (
  SELECT
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _x0._h AS _m0,
  _x1._h AS _m1
FROM _agg
LEFT JOIN _x0
  ON TRUE
LEFT JOIN _x1
  ON TRUE
