SELECT SUM(CASE WHEN age > 30 THEN spend ELSE 0 END) AS older_spend FROM visits
