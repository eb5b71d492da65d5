SELECT COUNT(*), AVG(age) FROM visits ANTI JOIN zones ON visits.region = zones.region
