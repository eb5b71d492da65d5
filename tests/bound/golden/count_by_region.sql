SELECT region, COUNT(*) AS n, COUNT(age) AS aged, COUNT(DISTINCT user_id) AS units
FROM visits GROUP BY region
