SELECT product, COUNT(*), SUM(price), COUNT(DISTINCT basket_id) FROM lines GROUP BY product
