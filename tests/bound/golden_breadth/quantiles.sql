SELECT region, MEDIAN(spend), QUANTILE_CONT(spend, 0.9), MIN(age), MAX(age) FROM visits GROUP BY region
