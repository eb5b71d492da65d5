"""Replays a page's shell transcript (``$`` commands, psql sessions, password prompts) in a real
terminal, and says which of its printed lines came out the same.

A transcript is a sequence of console blocks. A ``$ `` line (with ``\\`` continuations) is a
command for bash; in an interactive ``psql`` session, ``visits=> `` and ``visits-> `` lines are
what was typed at psql's prompt; every other line is output. The output lines checked are those
that do not depend on noise, time or process ids (CHECKED below); a transcript is replayed once
and each block then asks whether its own lines came out.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import pexpect

# Lines of a transcript that a replay must print again, verbatim after masking MASKS: notices
# and errors (charges, half-widths and refusals are public), and what the commands report.
CHECKED = re.compile(
    r"^(NOTICE: |ERROR: |dpsql: |OperationalError |added user |record \d+: |ledger verified: "
    r"|\| (ann|bob) \||(ann|bob|olga)\t|\['region'|SET$|\(\d+ rows?\)$| dataset \S+: "
    r"| (table|bounds|keys|measurement|cost)\b|# Privacy report|### |\d{4}-\d\d-\d\d .*dpsql)"
)
# Timestamps, query digests, process ids and the port differ on every run.
MASKS = (
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "), ""),
    (re.compile(r"\bquery [0-9a-f]{12}\b"), "query <digest>"),
    (re.compile(r"\bpid \d+"), "pid <pid>"),
    # A ratio's half-width is computed from its noisy parts; a count's is public.
    (re.compile(r"± \d+\.\d+"), "± <from noisy values>"),
    # A quantile's interval is drawn by the mechanism: noisy values too.
    (re.compile(r" in \[-?[\d.]+, -?[\d.]+\]"), " in [<from noisy values>]"),
)
PSQL_PROMPT = re.compile(r"^(\w+)[=-]> (.*)$")
PROMPT = "DOCS-PROMPT> "
PASSWORD_PROMPT = re.compile(r"^(Password( for user \w+)?|Repeat the password):\s*$")


def mask(line: str) -> str:
    line = line.rstrip()
    for pattern, replacement in MASKS:
        line = pattern.sub(replacement, line)
    return line


@dataclass
class Step:
    """A command for bash or a line typed at psql, with the output the page shows after it."""

    block: int  # the line of the page where its block starts
    text: str
    psql: bool
    shown: list[str] = field(default_factory=list)
    printed: str = ""

    @property
    def checked(self) -> list[str]:
        return [mask(line) for line in self.shown if CHECKED.match(line)]

    def missing(self) -> list[str]:
        printed = {mask(line) for line in self.printed.replace("\r", "").splitlines()}
        return [line for line in self.checked if line not in printed]


def parse(blocks: list[tuple[int, str]]) -> list[Step]:
    steps: list[Step] = []
    for start, code in blocks:
        lines = code.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("$ "):
                text = line[2:]
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1].rstrip() + " " + lines[i].strip()
                steps.append(Step(start, text, psql=False))
            elif (typed := PSQL_PROMPT.match(line)) is not None:
                steps.append(Step(start, typed.group(2), psql=True))
            elif steps:
                steps[-1].shown.append(line)
            i += 1
    return steps


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for(port: int, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port}")


def replay(
    steps: list[Step], folder: Path, env: dict[str, str], passwords: dict[str, str], port: int
) -> None:
    """Runs the steps in ``folder`` through an interactive bash, the page's port 5433 replaced
    by ``port``; each step's ``printed`` is what the terminal showed after it."""
    child = pexpect.spawn(
        "bash", ["--norc", "--noprofile"], cwd=str(folder), env=env, encoding="utf-8",
        timeout=120, dimensions=(2000, 400),
    )  # fmt: skip
    # PS1 spelled in two pieces, so that its echo does not match the prompt itself.
    child.sendline("PS1='DOCS''-PROMPT> '; PS2=''")
    child.expect_exact(PROMPT)
    prompts = [PROMPT, re.compile(r"\w+[=-]> ")]
    user = ""
    try:
        for step in steps:
            text = step.text.replace("5433", str(port))
            if not step.psql and (named := re.search(r"users add (\w+)|user=(\w+)", text)):
                user = named.group(1) or named.group(2)
            child.sendline(text)
            for line in step.shown:
                if (asked := PASSWORD_PROMPT.match(line)) is not None:
                    child.expect_exact(asked.group(0).strip())
                    child.sendline(passwords[user])
            child.expect(prompts)
            step.printed = child.before or ""
            if text.rstrip().endswith("&"):
                _wait_for(port)
            if text.startswith("kill "):
                child.sendline("wait")  # the server's last log lines are written when it exits
                child.expect_exact(PROMPT)
    finally:
        child.close(force=True)
