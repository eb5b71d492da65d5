SELECT region, COUNT(*), SUM(spend) FROM visits GROUP BY region
