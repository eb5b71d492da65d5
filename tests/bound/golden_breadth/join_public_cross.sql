SELECT tier, COUNT(*), SUM(spend) FROM visits CROSS JOIN tiers WHERE spend >= threshold GROUP BY tier
