SELECT region, AVG(age) AS mean_age FROM visits GROUP BY region
