SELECT COUNT(*), SUM(s2), MAX(s2) FROM (SELECT user_id, spend * 2 AS s2 FROM visits WHERE spend IS NOT NULL) AS q
