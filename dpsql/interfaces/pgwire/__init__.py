"""dpsql serve: a PostgreSQL wire protocol (v3) server in front of a dpsql Session."""
