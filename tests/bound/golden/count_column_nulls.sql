SELECT COUNT(spend) AS n FROM visits
