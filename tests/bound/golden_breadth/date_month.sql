SELECT month(day) AS m, COUNT(*), SUM(spend) FROM visits GROUP BY month(day)
