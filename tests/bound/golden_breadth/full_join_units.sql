SELECT COUNT(*), COUNT(spend), SUM(amount) FROM visits AS v FULL JOIN purchases AS p ON v.user_id = p.user_id
