SELECT channel, COUNT(*), SUM(price) FROM lines AS l JOIN baskets AS b ON l.basket_id = b.basket_id GROUP BY channel
