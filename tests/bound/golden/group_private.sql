SELECT age, COUNT(*) AS n, SUM(spend) AS total FROM visits GROUP BY age
