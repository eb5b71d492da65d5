SELECT COUNT(*) AS n, SUM(spend) AS total FROM visits WHERE spend * 2 > 20 AND age + 1 >= 30
