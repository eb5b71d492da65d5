SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits GROUP BY date_trunc('month', day)
