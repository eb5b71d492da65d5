SELECT COUNT(*) FROM visits a JOIN visits b ON a.user_id = b.user_id
