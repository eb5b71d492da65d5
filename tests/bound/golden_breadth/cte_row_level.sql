WITH t AS (SELECT user_id, region, spend * 2 AS s2 FROM visits WHERE age >= 30) SELECT region, SUM(s2), AVG(s2) FROM t GROUP BY region
