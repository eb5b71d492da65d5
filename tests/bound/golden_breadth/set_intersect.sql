SELECT COUNT(*), SUM(x), COUNT(DISTINCT user_id) FROM (SELECT user_id, spend AS x FROM visits INTERSECT SELECT user_id, amount FROM purchases) AS t
