SELECT SUM(spend) AS total FROM visits
