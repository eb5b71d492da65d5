WITH t AS (SELECT user_id, COUNT(*) AS n, AVG(spend) AS a FROM visits GROUP BY user_id) SELECT COUNT(*), SUM(LEAST(n, 5)), AVG(a) FROM t
