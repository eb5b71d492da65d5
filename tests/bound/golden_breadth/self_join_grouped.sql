SELECT a.region, COUNT(*), SUM(b.spend) FROM visits a JOIN visits b ON a.user_id = b.user_id GROUP BY a.region
