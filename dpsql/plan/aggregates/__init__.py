"""The aggregate kinds: one rule per kind, each declared in one module of this package and
listed in ``registry``; the SQL each answers is its entry in ``dpsql.sql.aggregates``."""
