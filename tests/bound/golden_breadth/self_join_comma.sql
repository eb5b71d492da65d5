SELECT COUNT(*) FROM visits a, visits b WHERE a.user_id = b.user_id
