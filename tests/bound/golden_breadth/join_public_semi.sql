SELECT region, COUNT(*), SUM(spend) FROM visits SEMI JOIN zones ON visits.region = zones.region GROUP BY region
