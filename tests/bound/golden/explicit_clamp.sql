SELECT region, SUM(LEAST(GREATEST(spend, 0), 50)) AS capped FROM visits GROUP BY region
