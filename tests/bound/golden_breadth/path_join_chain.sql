SELECT segment, COUNT(*), SUM(price) FROM lines AS l JOIN baskets AS b ON l.basket_id = b.basket_id JOIN people AS p ON b.user_id = p.user_id GROUP BY segment
