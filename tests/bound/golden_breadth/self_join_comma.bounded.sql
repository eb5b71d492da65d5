WITH _rows AS (
  SELECT
    "a_user_id" AS _u
  FROM (
    SELECT
      "_j0"."user_id" AS "a_user_id",
      "_j0"."region" AS "a_region",
      "_j0"."age" AS "a_age",
      "_j0"."spend" AS "a_spend",
      "_j0"."day" AS "a_day",
      "_j0"."item" AS "a_item",
      "_j1"."user_id" AS "b_user_id",
      "_j1"."region" AS "b_region",
      "_j1"."age" AS "b_age",
      "_j1"."spend" AS "b_spend",
      "_j1"."day" AS "b_day",
      "_j1"."item" AS "b_item"
    FROM "visits" AS "_j0"
    JOIN "visits" AS "_j1"
      ON "_j0"."user_id" = "_j1"."user_id"
  ) AS _src
  WHERE
    "a_user_id" = "b_user_id"
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
    SUM(_c) AS _m0,
    COUNT(*) AS _z
  FROM _capped
)
SELECT
  _agg._m0
FROM _agg
