SELECT COUNT(*), COUNT(x), SUM(x) FROM (SELECT user_id, spend AS x FROM visits EXCEPT SELECT user_id, amount FROM purchases) AS t
