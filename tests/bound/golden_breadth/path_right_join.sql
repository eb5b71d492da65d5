SELECT channel, COUNT(*), COUNT(price), SUM(price) FROM lines AS l RIGHT JOIN baskets AS b ON l.basket_id = b.basket_id GROUP BY channel
