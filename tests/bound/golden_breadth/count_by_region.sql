SELECT region, COUNT(*), COUNT(age), COUNT(DISTINCT user_id) FROM visits GROUP BY region
