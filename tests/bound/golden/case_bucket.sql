SELECT CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'middle' ELSE 'old' END AS bucket, COUNT(*) AS n, SUM(spend) AS total FROM visits GROUP BY bucket
