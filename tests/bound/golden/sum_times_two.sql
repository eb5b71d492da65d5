SELECT SUM(spend * 2) AS doubled FROM visits
