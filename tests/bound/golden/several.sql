SELECT region, COUNT(*) AS n, COUNT(spend) AS n_spend, SUM(spend) AS total, AVG(spend) AS mean, COUNT(DISTINCT user_id) AS users FROM visits GROUP BY region
