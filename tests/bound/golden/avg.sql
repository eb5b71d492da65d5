SELECT AVG(spend) AS mean FROM visits
