"""Apache Spark as an engine: dpsql's bounded query lowered to Spark SQL with the same totals,
and run on a Spark session.

Running it: ``engine`` (``SparkEngine``) and ``session`` (where its Spark session comes from),
the only modules that touch pyspark. Lowering it (``lower.lower``, a pure function): ``shape``
rewrites the DuckDB tree into forms Spark runs faster; ``lowerer`` lowers the queries, with
``relations`` for FROM, and every expression through the dispatch table of ``handlers``, whose
handlers live by kind in ``leaves``, ``casts``, ``arith``, ``logic``, ``branches``,
``functions``, ``dates``, ``lists``, ``aggregates``, ``sums`` and ``histogram``; beneath them
all, ``nodes`` (what the lowering shares), ``types`` (DuckDB's types) and ``dialect`` (the
Spark SQL printed, the refusal).
"""
