SELECT region, COUNT(DISTINCT item), COUNT(DISTINCT user_id) FROM visits GROUP BY region
