"""Every code block of README.md and docs/ runs, so that none can go stale.

Fenced blocks tagged ``python``, ``sh``, ``sql``, ``toml`` and ``console`` are run; untagged
blocks are synopses or a program's output, and are not. A block may be preceded by one
directive line, ``<!-- docs-test: ... -->``:

- ``setup=cursor``: a fragment that uses ``conn``, ``cur`` and ``sql``: run after a prelude that
  connects to the example policy;
- ``cwd=durable``: run in a folder holding ``policy.toml``, the durable example with its ledger
  created (``dpsql init``), as the page's walk-through has it;
- ``server``: run against a live ``dpsql serve`` of the durable example, with the users the page
  names (``alice``/``secret``, ``ann``/``ann-secret-1``), its address put in place of the page's;
- ``walkthrough`` (``console`` blocks): the ``$ `` lines of this block, after those of the
  page's earlier walkthrough blocks, as one shell script in a folder holding ``policy.toml``
  (the durable example, its ledger not created yet);
- ``server-walkthrough`` (``console`` blocks): the page's transcript of a server, its users and
  their psql sessions, replayed once in a terminal (``docs_transcript``) in a folder holding the
  page's step-2 policy and its ``analysis.py``; each block's lines that do not depend on noise,
  time or process ids must come out again;
- ``skip: why``: not run, for the reason given (shown when the test is skipped). A
  ``console`` block needs one of these three.

Python blocks run in a fresh interpreter from the repository root; ``sh`` blocks line by line
(``make test`` itself excepted: it is the command that runs this test); ``sql`` blocks through a
session of the example policy (statements are charged and answered); ``toml`` blocks are loaded
as policies when they have a ``[dataset]``, else parsed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docs_transcript
import pytest
from click.testing import CliRunner
from server_fixtures import ServerThread

from dpsql.errors import PolicyError
from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.pgwire.users import add_user
from dpsql.policy import load_policy
from dpsql.session.session import Session
from dpsql.sql.split import split_statements

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DATA = ROOT / "examples" / "data" / "visits.parquet"
FENCE = re.compile(
    r"(?:<!-- docs-test: (?P<directive>[^>]*?) -->\n)?```(?P<lang>\w+)\n(?P<code>.*?)```", re.S
)
RUN = {"python", "sh", "sql", "toml", "console"}
PRELUDE = """import dpsql
conn = dpsql.connect("examples/policy.toml")
cur = conn.cursor()
sql = "SELECT COUNT(*) FROM visits"
"""


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    directive: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}:{self.lang}"


def _blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match.group("lang") in RUN:
                line = text[: match.start("code")].count("\n")
                directive = (match.group("directive") or "").strip()
                lang, code = match.group("lang"), match.group("code")
                found.append(Block(page.name, line, lang, code, directive))
    return found


BLOCKS = _blocks()


def test_the_blocks_are_found() -> None:
    langs = {b.lang for b in BLOCKS}
    assert {"python", "sh", "sql", "toml", "console"} <= langs
    assert sum(b.lang == "python" for b in BLOCKS) >= 8


@pytest.fixture(autouse=True)
def _example_data() -> None:
    if not DATA.exists():
        pytest.skip("run `make demo` (or examples/make_data.py) to create the example data")


def _durable(folder: Path) -> Path:
    """``folder/policy.toml``: the durable example, its data absolute, its ledger created."""
    path = _walkthrough_folder(folder)
    done = CliRunner().invoke(cli.cli, ["--policy", str(path), "init"])
    assert done.exit_code == 0, done.output
    return path


def _walkthrough_folder(folder: Path) -> Path:
    """``folder/policy.toml``: the durable example, its data absolute, no ledger yet."""
    text = (ROOT / "examples" / "durable.toml").read_text(encoding="utf-8")
    text = text.replace('"data/visits.parquet"', f'"{DATA}"')
    path = folder / "policy.toml"
    path.write_text(text.replace('"data/visits.ledger"', '"visits.ledger"'), encoding="utf-8")
    return path


def _python(code: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@contextlib.contextmanager
def _served(folder: Path) -> Iterator[int]:
    """A live ``dpsql serve`` of the durable example, with the users the pages name."""
    policy = _durable(folder)
    users = folder / "users.json"
    for name, password in (("alice", "secret"), ("ann", "ann-secret-1"), ("bob", "bob-secret")):
        add_user(users, name, password, "analyst")
    with ServerThread(policy, users) as server:
        yield server.port


# The page's analysis.py connects as ann with this password, so its transcript types it.
TRANSCRIPT_PASSWORDS = {"ann": "ann-secret-1"}


def _transcript_folder(page: str, folder: Path, port: int) -> None:
    """The page's step-2 policy (a ``toml`` block naming a ``[ledger]``) with the example's
    ``[tables.visits]``, and its ``# analysis.py`` block as a file (connecting to ``port``)."""
    policy = next(b.code for b in BLOCKS if b.page == page and "[ledger]" in b.code)
    policy = policy.replace('"data/visits.parquet"', f'"{DATA}"')
    example = (ROOT / "examples" / "policy.toml").read_text(encoding="utf-8")
    tables = example[example.index("[tables.visits]") :]
    (folder / "policy.toml").write_text(policy + "\n" + tables, encoding="utf-8")
    for block in BLOCKS:
        if block.page == page and block.code.startswith("# analysis.py"):
            code = block.code.replace("port=5433", f"port={port}")
            (folder / "analysis.py").write_text(code, encoding="utf-8")


@pytest.fixture(scope="module")
def transcripts(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, list[docs_transcript.Step]]]:
    """Each page's server walk-through, replayed once when a block first asks for it."""
    done: dict[str, list[docs_transcript.Step]] = {}

    class Replays(dict[str, list[docs_transcript.Step]]):
        def __missing__(self, page: str) -> list[docs_transcript.Step]:
            if shutil.which("psql") is None:
                pytest.skip("needs the psql client")
            folder = tmp_path_factory.mktemp("transcript")
            port = docs_transcript.free_port()
            _transcript_folder(page, folder, port)
            blocks = [
                (b.line, b.code)
                for b in BLOCKS
                if b.page == page and b.directive == "server-walkthrough"
            ]
            steps = docs_transcript.parse(blocks)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("DPSQL_", "PG"))}
            path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
            env.update(
                PATH=path, HOME=str(folder), PSQLRC=os.devnull, PSQL_PAGER="cat", PAGER="cat",
                TERM="dumb", PYTHONPATH=str(ROOT),
            )  # fmt: skip
            docs_transcript.replay(steps, folder, env, TRANSCRIPT_PASSWORDS, port)
            self[page] = steps
            return steps

    replays = Replays(done)
    yield replays


# A page's server walk-through is replayed once per worker that asks for it: its blocks run on
# one worker (an xdist group), so it is replayed once.
_PARAMS = [
    pytest.param(b, marks=pytest.mark.xdist_group(f"transcript-{b.page}"))
    if b.directive == "server-walkthrough"
    else b
    for b in BLOCKS
]


@pytest.mark.parametrize("block", _PARAMS, ids=[b.id for b in BLOCKS])
def test_the_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    directive = block.directive
    if directive.startswith("skip:"):
        pytest.skip(directive[len("skip:") :].strip())
    if directive == "server-walkthrough":
        steps = request.getfixturevalue("transcripts")[block.page]
        mine = [step for step in steps if step.block == block.line]
        assert sum(len(step.checked) for step in mine) > 0, "a transcript block checks nothing"
        missing = [(step.text, step.missing()) for step in mine if step.missing()]
        assert not missing, (missing, [s.printed for s in mine if s.missing()])
        return
    if block.lang == "python":
        if directive == "server":
            with _served(tmp_path) as port:
                code = block.code.replace("db-proxy:5433", f"127.0.0.1:{port}")
                _python(code.replace("port=5433", f"port={port}"), tmp_path)
            return
        if directive == "cwd=durable":
            _durable(tmp_path)
            _python(block.code, tmp_path)
            return
        code = PRELUDE + block.code if directive == "setup=cursor" else block.code
        _python(code, ROOT)
    elif block.lang == "sh":
        if "examples/durable.toml" in block.code and not (DATA.parent / "visits.ledger").exists():
            # As the page says: after `make demo`, which creates the durable example's ledger.
            made = subprocess.run(
                ["make", "examples/data/visits.ledger"], cwd=ROOT, capture_output=True,
                text=True, timeout=300, check=False,
            )  # fmt: skip
            assert made.returncode == 0, made.stderr[-2000:]
        for line in block.code.splitlines():
            command = line.split("#", 1)[0].strip()
            if not command or command == "make test":
                continue  # make test is the command that runs this test
            # The project's environment first: its dpsql, as after `make demo`.
            path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
            done = subprocess.run(
                command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=600,
                check=False, env={**os.environ, "PATH": path},
            )  # fmt: skip
            assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    elif block.lang == "console":
        assert directive == "walkthrough", f"{block.id}: a console block needs a directive"
        steps = [b for b in BLOCKS if b.page == block.page and b.directive == "walkthrough"]
        commands = [
            line[2:]
            for b in steps[: steps.index(block) + 1]
            for line in b.code.splitlines()
            if line.startswith("$ ")
        ]
        _walkthrough_folder(tmp_path)
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPSQL_")}
        done = subprocess.run(
            ["bash", "-e", "-c", "\n".join(commands)], cwd=tmp_path, capture_output=True,
            text=True, timeout=300, check=False, env={**env, "PATH": path},
        )  # fmt: skip
        assert done.returncode == 0, (commands, done.stdout[-2000:], done.stderr[-2000:])
    elif block.lang == "sql":
        session = Session(ROOT / "examples" / "policy.toml")
        # Statements end with ";", or a block of session commands lists one per line.
        lines = [line for line in block.code.splitlines() if line.split("--")[0].strip()]
        commands = all(line.split()[0].upper() in ("SET", "RESET", "SHOW") for line in lines)
        if ";" in block.code:
            texts = [p.text for p in split_statements(block.code)]
        else:
            texts = lines if commands else [block.code]
        try:
            for text in texts:
                session.execute(text)
        finally:
            session.close()
    else:
        data = tomllib.loads(block.code)
        if "dataset" in data or "budget" in data or "tables" in data or "ledger" in data:
            # A whole policy, or sections of one: merged over the example policy, so that a
            # field that is not (or no longer) in the policy fails.
            merged = tomllib.loads((ROOT / "examples" / "policy.toml").read_text("utf-8"))
            for key, value in data.items():
                if isinstance(value, dict) and isinstance(merged.get(key), dict):
                    merged[key] = {**merged[key], **value}
                else:
                    merged[key] = value
            try:
                load_policy(merged, base_dir=ROOT / "examples")
            except PolicyError as exc:
                pytest.fail(f"{block.id}: {exc}")
