WITH _rows AS (
  SELECT
    "user_id" AS _u,
    "region" AS _k0,
    "spend" AS _x0
  FROM "visits"
  WHERE
    (
      "region" IN ('central', 'east', 'north', 'south', 'west')
    )
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
), _units AS (
  SELECT
    _u,
    _k0,
    COUNT(*) AS _n,
    COUNT(_v0) AS _n0,
    COALESCE(SUM(_v0), 0) AS _s0
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
    LEAST(_n, 10) AS _c,
    LEAST(_n0, 10) AS _c0,
    CASE
      WHEN _n0 <= 10
      THEN CAST(_s0 AS INT128)
      ELSE LEAST(
        GREATEST(
          (
            10 * (
              CAST(_s0 AS INT128) // CAST(_n0 AS INT128) - CASE WHEN CAST(_s0 AS INT128) % CAST(_n0 AS INT128) < 0 THEN 1 ELSE 0 END
            ) + (
              2 * 10 * (
                CAST(_s0 AS INT128) - (
                  CAST(_s0 AS INT128) // CAST(_n0 AS INT128) - CASE WHEN CAST(_s0 AS INT128) % CAST(_n0 AS INT128) < 0 THEN 1 ELSE 0 END
                ) * CAST(_n0 AS INT128)
              ) + CAST(_n0 AS INT128)
            ) // (
              2 * CAST(_n0 AS INT128)
            )
          ),
          CAST(0 AS INT128)
        ),
        CAST(16384000 AS INT128)
      )
    END AS _t0
  FROM _kept
), _agg AS (
  SELECT
    _k0,
    CAST(SUM(_c) AS BIGINT) AS _m0,
    CAST(SUM(_c0) AS BIGINT) AS _m1,
    SUM(_t0) AS _m2,
    SUM(2 * _t0 - _c0 * CAST(1638400 AS INT128)) AS _m3,
    COUNT(*) AS _m4,
    COUNT(*) AS _z
  FROM _capped
  GROUP BY
    _k0
)
SELECT
  _d._k0 AS _k0,
  COALESCE(_f._m0, 0) AS _m0,
  COALESCE(_f._m1, 0) AS _m1,
  COALESCE(_f._m2, 0) AS _m2,
  COALESCE(_f._m3, 0) AS _m3,
  COALESCE(_f._m4, 0) AS _m4
FROM (
  SELECT
    *
  FROM (VALUES
    ('central'),
    ('east'),
    ('north'),
    ('south'),
    ('west')) AS _d0(_k0)
) AS _d
LEFT JOIN (
  SELECT
    _agg._k0,
    _agg._m0,
    _agg._m1,
    _agg._m2,
    _agg._m3,
    _agg._m4
  FROM _agg
) AS _f
  ON _d._k0 IS NOT DISTINCT FROM _f._k0
