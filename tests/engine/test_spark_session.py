"""One Spark Connect client's close leaves the other clients' queries running.

PySpark 4.0's Connect client releases results through one thread pool per process, and any
client's ``close`` (``SparkSession.stop``, or the session's ``__del__`` when it is collected)
shut it down for all: another engine's query then failed mid-fetch after its charge, or hung
when the collection happened inside the pool's own ``submit``. ``spark_session._keep_release_pool``
keeps the pool. No server is needed: a Connect session reaches its server only when used.
"""

from __future__ import annotations

import importlib

import pytest

from dpsql.engine.spark import session as spark_session

pytestmark = [pytest.mark.spark]


def test_closing_a_connect_session_keeps_the_shared_release_pool() -> None:
    pytest.importorskip("pyspark.sql.connect.session")
    reattach = importlib.import_module("pyspark.sql.connect.client.reattach")
    first = spark_session.connect_session("sc://127.0.0.1:1")
    second = spark_session.connect_session("sc://127.0.0.1:1")
    pool = reattach.ExecutePlanResponseReattachableIterator._get_or_create_release_thread_pool()
    # What stop() ends with, after releasing the server session (there is no server here).
    first.client.close()
    del first  # its __del__ closes its client again
    # The second client's next ReleaseExecute goes through the same pool, which still runs.
    assert pool.submit(lambda: 42).result(timeout=10) == 42
    assert reattach.ExecutePlanResponseReattachableIterator._release_thread_pool_instance is pool
    second.client.close()
