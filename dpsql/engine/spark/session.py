"""Where a Spark engine's session comes from: the process's classic Spark session for a master
(``classic_session``, made once and shared: a JVM takes seconds to start), a Spark Connect
client session of the engine's own (``connect_session``), the settings dpsql pins set and read
back on either (``pin_settings``), and the command that starts a Spark Connect server for dpsql
(``connect_server_command``)."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from pathlib import Path
from typing import Any

from dpsql.errors import PolicyError
from dpsql.policy.engine import SPARK_PINNED, EngineSpec

__all__ = ["classic_session", "connect_server_command", "connect_session", "pin_settings"]

_SESSIONS: dict[tuple[Any, ...], Any] = {}
_SESSIONS_LOCK = threading.Lock()


def classic_session(spec: EngineSpec) -> Any:
    """The process's Spark session for this master and settings, made once: a Spark session
    takes seconds to start. (A Spark Connect client is ``connect_session``.)"""
    try:
        sql = importlib.import_module("pyspark.sql")
    except ImportError:
        raise PolicyError(
            'engine.name = "spark" needs pyspark: install dpsql with its spark extra'
        ) from None
    # No progress bars on the console (the server's log is its standard error).
    conf = {"spark.ui.showConsoleProgress": "false", **spec.conf, **SPARK_PINNED}
    key = (spec.master, tuple(sorted(conf.items())))
    with _SESSIONS_LOCK:
        if key in _SESSIONS:
            return _SESSIONS[key]
        builder = sql.SparkSession.builder.appName("dpsql").master(spec.master or "local[*]")
        for name, value in conf.items():
            builder = builder.config(name, value)
        try:
            session = builder.getOrCreate()
        except Exception as exc:  # no Java, a master that cannot be reached, ...
            raise PolicyError(f"cannot start the Spark engine ({type(exc).__name__})") from None
        # Spark's log lines quote SQL text and the data values an error met.
        session.sparkContext.setLogLevel("OFF")
        # PySpark logs a failed query's text (and the values its error quotes) through this.
        logging.getLogger("SQLQueryContextLogger").disabled = True
        _SESSIONS[key] = session
        return session


def _keep_release_pool() -> None:
    """Closing one Spark Connect client must not stop the others' queries.

    PySpark 4.0's client sends its ReleaseExecute calls through one thread pool per process,
    and ``SparkConnectClient.close`` -- called by ``SparkSession.stop`` and by the session's
    ``__del__`` whenever one is garbage-collected -- shuts that pool down for every client.
    Another engine's query then fails mid-fetch ("cannot schedule new futures after
    shutdown"), after its charge; or, when the collection happens inside that pool's
    ``submit`` (which holds the pool's lock while it starts a thread), the shutdown waits on
    the very thread being started and the query hangs. The pool is kept for the process
    instead: its threads idle, and end with the interpreter. ``tests/engine/test_spark_session.py``
    pins it."""
    reattach = importlib.import_module("pyspark.sql.connect.client.reattach")
    iterator = reattach.ExecutePlanResponseReattachableIterator
    if not getattr(iterator, "_dpsql_kept", False):
        iterator.shutdown = classmethod(lambda cls: None)
        iterator._dpsql_kept = True


def connect_session(remote: str) -> Any:
    """A new session of the Spark Connect server at ``remote``, the engine's own: the server
    keeps temporary views and settings per session, so engines' views never meet.

    Made with the client's session class, not ``SparkSession.builder``: the builder marks the
    whole process as a Connect client (an environment variable, after which a classic session
    of the process would be a Connect one too), refuses to run beside a classic session, and
    hands every caller the one default session. Nothing reaches the server until first used."""
    try:
        client = importlib.import_module("pyspark.sql.connect.session")
    except ImportError:  # pyspark without its connect extra (grpcio, ...)
        raise PolicyError(
            "engine.remote needs the Spark Connect client of pyspark: install dpsql with its "
            "spark extra"
        ) from None
    _keep_release_pool()
    # The client logs each plan it sends (SQL text, and the salt among its parameters) when
    # SPARK_CONNECT_LOG_LEVEL is set: off, as Spark's own logs are.
    logging.getLogger("pyspark.sql.connect.logging").disabled = True
    # PySpark logs a failed query's text (and the values its error quotes) through this.
    logging.getLogger("SQLQueryContextLogger").disabled = True
    try:
        return client.SparkSession(connection=remote)
    except Exception as exc:  # an address the client cannot parse
        raise PolicyError(f"cannot start the Spark Connect client ({type(exc).__name__})") from None


def pin_settings(session: Any) -> None:
    """The settings dpsql pins, set where this session can set them, then each one read back:
    a setting only the server or the context sets (the UI, say) must already hold. Raises a
    PolicyError naming the first that differs."""
    conf = session.conf
    for name, value in SPARK_PINNED.items():
        if conf.isModifiable(name):  # session settings: ANSI mode, the zone, Parquet's reading
            conf.set(name, value)
    for name, value in SPARK_PINNED.items():
        found = conf.get(name, None)  # None: unset, so Spark's own default (the UI: on)
        # The guarantees assume every pinned value: never run on a Spark that differs.
        if found is None or found.strip().lower() != value.lower():
            raise PolicyError(
                f"{name} is {found if found is not None else 'not set'} on this Spark, and "
                f"dpsql needs {value}: set it where Spark starts (the Spark Connect server's "
                "--conf)"
            )


def connect_server_command(
    port: int = 15002, host: str = "127.0.0.1", master: str = "local[*]"
) -> list[str]:
    """The command that starts a Spark Connect server for dpsql from pyspark's own install
    (its ``spark-submit`` and the Connect server in its jars): Spark's ``SparkConnectServer``
    on ``master``, listening on ``host:port``, with every setting dpsql pins. A Connect client
    cannot set the static ones (the UI), and the engine refuses a server that differs."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise PolicyError("a Spark Connect server needs pyspark: install dpsql's spark extra")
    submit = Path(spec.origin).parent / "bin" / "spark-submit"
    command = [str(submit), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    command += ["--master", master, "--name", "dpsql Spark Connect"]
    settings = {
        # This address only: Spark Connect authenticates no one, whoever reaches it reads rows.
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        # As dpsql's own Spark: the log quotes SQL text and the data values an error met.
        "spark.log.level": "OFF",
        "spark.ui.showConsoleProgress": "false",
        **SPARK_PINNED,  # the static ones only a server sets; the engine checks them all
    }
    for name, value in settings.items():
        command += ["--conf", f"{name}={value}"]
    return command
