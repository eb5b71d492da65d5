SELECT region, COUNT(*), SUM(amount) FROM visits JOIN purchases ON visits.user_id = purchases.user_id GROUP BY region
