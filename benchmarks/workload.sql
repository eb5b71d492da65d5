-- The batch the workload planner is measured on (docs/workload.md), fixed before any tuning:
-- a total; by region; by region x month; SUM and AVG(spend) by region; STDDEV; a quantile;
-- a CASE histogram. The other group makes the region and month domains total, so that the
-- coarser statements may be answered from rows bounded at the finer grouping.
SET dpsql.other_group = on;
SELECT COUNT(*) AS n FROM visits;
SELECT region, COUNT(*) AS n FROM visits GROUP BY region;
SELECT region, date_trunc('month', day) AS month, COUNT(*) AS n FROM visits GROUP BY region, month;
SELECT region, SUM(spend) AS total, AVG(spend) AS mean FROM visits GROUP BY region;
SELECT region, STDDEV(spend) AS sd FROM visits GROUP BY region;
SELECT QUANTILE_CONT(spend, 0.5) AS median FROM visits;
SELECT CASE WHEN spend < 50 THEN 'low' WHEN spend < 100 THEN 'mid' ELSE 'high' END AS band,
       COUNT(*) AS n
FROM visits GROUP BY band;
