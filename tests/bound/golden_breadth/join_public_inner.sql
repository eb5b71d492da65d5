SELECT zone, COUNT(*), SUM(spend) FROM visits JOIN zones ON visits.region = zones.region GROUP BY zone
