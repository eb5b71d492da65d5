SELECT visits.region, COUNT(*), COUNT(zone) FROM visits LEFT JOIN zones ON visits.region = zones.region GROUP BY visits.region
