SELECT COUNT(*), SUM(x) FROM (SELECT spend AS x FROM visits UNION ALL SELECT amount FROM purchases UNION ALL SELECT price FROM lines) AS t
