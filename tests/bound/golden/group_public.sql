SELECT region, SUM(spend) AS total FROM visits GROUP BY region
