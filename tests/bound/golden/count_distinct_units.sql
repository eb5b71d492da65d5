SELECT COUNT(DISTINCT user_id) AS users FROM visits
