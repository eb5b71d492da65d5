SELECT segment, COUNT(*), SUM(price) FROM lines AS l, baskets AS b, people AS p WHERE l.basket_id = b.basket_id AND b.user_id = p.user_id GROUP BY segment
