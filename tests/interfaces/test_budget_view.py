"""``dpsql budget show``, ``dpsql budget what-if``, ``dpsql demo``, the charts and the HTML report.

The commands are registered on a group of this file's own built like ``cli.cli`` (the same
``DpsqlGroup`` and ``Config`` object), over a policy whose ledger lives in tmp_path and whose
table is the example data. Charts are checked as files (PNG signature and size, SVG parsed as
XML with its texts read back); what-if counts against closed forms computed here; the HTML
report against the Markdown report's sections, with a strict tag-balance parser.
"""

from __future__ import annotations

import math
import re
import shutil
import struct
import xml.etree.ElementTree as ET
from fractions import Fraction
from html.parser import HTMLParser
from pathlib import Path

import click
import matplotlib.image
import pytest
from click.testing import CliRunner, Result
from scipy.optimize import brentq
from scipy.stats import norm

import dpsql
from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.ledger.store import open_store
from dpsql.interfaces.cli import budget_view
from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.cli.budget_view import demo_command, show_command
from dpsql.interfaces.cli.whatif import whatif_command
from dpsql.interfaces.report.charts import CURVES, history_curves, label, write_chart
from dpsql.interfaces.report.html import render_html, schedule_curves
from dpsql.interfaces.report.markdown import render_markdown
from dpsql.interfaces.report.report import build_report
from dpsql.interfaces.report.whatif import fit_count
from dpsql.mechanisms.conversions import zcdp_to_dp
from dpsql.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "visits.parquet"
POLICY = """
[dataset]
id = "visits-budget"
data_version = "v1"

[data]
tables = {{ visits = "{data}" }}

[budget]
diagnose = false
epsilon = 1.0
delta = 1e-6
query_epsilon = 0.1
query_delta = 1e-8

[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 10

[tables.visits.columns.spend]
lower = 0
upper = 200

[tables.visits.columns.region]
public_values = ["central", "east", "north", "south", "west"]

[ledger]
path = "visits.ledger"
"""
QUERIES: tuple[tuple[str, dict[str, str]], ...] = (
    ("SELECT COUNT(*) AS n FROM visits", {}),
    ("SELECT region, SUM(spend) AS s FROM visits GROUP BY region", {}),
    ("SELECT COUNT(*) AS n FROM visits WHERE spend > 10", {"epsilon": "0.2"}),
)
SPENT = Fraction(4, 10)  # the basic composition of QUERIES


@pytest.fixture(autouse=True)
def _example_data() -> None:
    if not DATA.exists():
        pytest.skip("run `make demo` (or examples/make_data.py) to create the example data")


def group() -> click.Group:
    """A ``dpsql`` group with this module's commands, as ``cli.py`` registers them."""

    @click.group(cls=cli.DpsqlGroup)
    @click.option("--policy", "policy_path", type=click.Path(path_type=Path))
    @click.pass_context
    def root(ctx: click.Context, policy_path: Path | None) -> None:
        ctx.obj = cli.Config(policy_path, None)

    budget = click.Group("budget")
    budget.add_command(show_command)
    budget.add_command(whatif_command)
    root.add_command(budget)
    root.add_command(demo_command)
    return root


def run(policy: Path | None, *args: str) -> Result:
    prefix = ["--policy", str(policy)] if policy is not None else []
    return CliRunner().invoke(group(), [*prefix, *args])


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY.format(data=DATA), encoding="utf-8")
    result = CliRunner().invoke(cli.cli, ["--policy", str(path), "init"])
    assert result.exit_code == 0, result.stderr
    return path


@pytest.fixture
def policy(empty: Path) -> Path:
    with dpsql.connect(empty) as conn:
        for sql, options in QUERIES:
            conn.cursor().execute(sql, **options)
    return empty


def ledger_bytes(policy: Path) -> bytes:
    return (policy.parent / "visits.ledger").read_bytes()


def rows(output: str) -> dict[str, list[str]]:
    """The rows of a rich table in ``output``, by their first cell."""
    found = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0]:
            found[cells[0]] = cells[1:]
    return found


# -- show -------------------------------------------------------------------------------------
def test_show_lists_every_accountant_with_its_label_and_charges_nothing(policy: Path) -> None:
    before = ledger_bytes(policy)
    result = run(policy, "budget", "show", "--compare")
    assert result.exit_code == 0, result.output
    assert ledger_bytes(policy) == before
    assert "The basic filter decides admission" in result.output
    # In decimals (never 2/5), spent rounded up and what is left rounded down; the lead line.
    assert result.output.startswith("dataset visits-budget: epsilon 0.4 spent of 1 (0.6 left)")
    assert "/" not in result.output.split("\n")[1]
    table = rows(result.output)
    expected = {
        "basic": "decides",
        "advanced": "as if fixed in advance",
        "optimal": "as if fixed in advance",
        # The best order, or the summed rho or mu, of adaptively chosen parameters read after
        # the fact: no filter's bound and no odometer's (accounting.md, "Labels").
        "rdp": "as if fixed in advance",
        "zcdp": "as if fixed in advance",
        "gdp": "as if fixed in advance",
        "pld": "as if fixed in advance",
    }
    assert {name: table[name][-1] for name in expected} == expected
    assert table["basic"][:2] == ["0.4", "0.6"]
    for note in ("decides:", "valid adaptively:", "as if fixed in advance:"):
        assert note in result.output  # the labels are explained


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_show_chart_is_a_valid_file_with_axes_title_and_legend(policy: Path, suffix: str) -> None:
    chart = policy.parent / f"chart{suffix}"
    result = run(policy, "budget", "show", "--chart", str(chart))
    assert result.exit_code == 0, result.output
    if suffix == ".png":
        check_png(chart)
    else:
        texts = svg_texts(chart)
        for text in (
            "number of queries",
            "cumulative ε at δ = 1e-06",
            "budget cap ε = 1",
            "Data set visits-budget: ε of the actual history at δ = 1e-06",
            *(label(name) for name in CURVES),
        ):
            assert text in texts, text


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (700, 420)
    assert matplotlib.image.imread(str(path)).shape[:2] == (420, 700)


def svg_texts(path: Path) -> set[str]:
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return {"".join(e.itertext()).strip() for e in root.iter("{http://www.w3.org/2000/svg}text")}


def test_the_history_curves_end_at_the_reports_figures(policy: Path) -> None:
    loaded = load_policy(policy)
    budget = budget_for(loaded.dataset.id, loaded.budget, open_store(loaded))
    curves = history_curves(budget)
    assert curves.queries == (0, 1, 2, 3)
    assert curves.epsilons["basic"] == (0.0, 0.1, 0.2, 0.4)
    figures = {f.accountant: f.epsilon for f in budget.report().figures}
    for name in CURVES:
        assert curves.epsilons[name][0] == 0.0
        assert curves.epsilons[name][-1] == pytest.approx(figures[name], rel=1e-9)
    assert curves.cap == 1.0 and curves.delta == 1e-6


def test_a_chart_file_must_be_png_or_svg(policy: Path) -> None:
    result = run(policy, "budget", "show", "--chart", str(policy.parent / "chart.jpg"))
    assert result.exit_code == 2
    assert "must end in .png or .svg" in result.stderr


# -- what-if ----------------------------------------------------------------------------------
@pytest.mark.parametrize("epsilon", ["0.05", "0.01"])
def test_whatif_counts_agree_with_closed_forms_and_charge_nothing(
    policy: Path, epsilon: str
) -> None:
    before = ledger_bytes(policy)
    result = run(policy, "budget", "what-if", "--epsilon", epsilon, "--queries", "20")
    assert result.exit_code == 0, result.output
    assert ledger_bytes(policy) == before
    assert "Nothing was charged." in result.output
    table = rows(result.output)
    counts = {name: int(table[name][1]) for name in ("basic", "advanced", "rdp", "zcdp", "pld")}
    eps_r, delta_r, e = 1 - SPENT, remaining_delta(policy), Fraction(epsilon)
    assert counts["basic"] == math.floor(eps_r / e)
    assert Fraction(table["basic"][0]) == 20 * e
    # Kairouz-Oh-Viswanath (the advanced accountant's theorem), delta' = delta_r / 2, or basic.
    x = float(e)

    def kov(k: int) -> bool:
        term = k * x * math.tanh(x / 2) + math.sqrt(2 * k * x * x * math.log(2 / delta_r))
        return k * e <= eps_r or term <= float(eps_r)

    assert counts["advanced"] == max(k for k in range(1, 1000) if kov(k))
    # zCDP: rho = k e^2 / 2 and the CKS conversion at delta_r.
    rho = x**2 / 2
    fits = [k for k in range(1, 1000) if zcdp_to_dp(k * rho, delta_r) <= float(eps_r)]
    assert counts["zcdp"] == max(fits, default=0)
    # Tighter theorems admit at least as many pure-DP queries as basic composition.
    assert counts["pld"] >= counts["basic"]
    if epsilon == "0.01":  # many small queries: the square-root theorems win
        assert counts["advanced"] > counts["basic"] and counts["zcdp"] > counts["basic"]
        assert counts["rdp"] > counts["basic"] and counts["pld"] > counts["advanced"]


def remaining_delta(policy: Path) -> float:
    loaded = load_policy(policy)
    budget = budget_for(loaded.dataset.id, loaded.budget, open_store(loaded))
    return float(budget.report().delta_remaining)


def gaussian_epsilon(sigma: float, delta: float) -> float:
    """Balle-Wang 2018, Theorem 8: the exact epsilon of N(0, sigma^2), sensitivity 1."""
    mu = 1 / sigma

    def excess(eps: float) -> float:
        return (
            float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))
            - delta
        )

    return float(brentq(excess, 0.0, 100.0, xtol=1e-12))


def test_whatif_gaussian_counts_and_svg_chart(empty: Path) -> None:
    chart = empty.parent / "whatif.svg"
    args = ("budget", "what-if", "--sigma", "20", "--queries", "30", "--chart", str(chart))
    result = run(empty, *args)
    assert result.exit_code == 0, result.output
    table = rows(result.output)
    counts = {name: int(table[name][1]) for name in ("basic", "rdp", "zcdp", "pld")}
    # basic: k queries, each at delta/k, must keep k * epsilon_G(delta/k) <= 1.
    direct = max(k for k in range(1, 60) if k * gaussian_epsilon(20, 1e-6 / k) <= 1.0)
    assert counts["basic"] == direct
    # zCDP: rho = k / (2 sigma^2).
    assert counts["zcdp"] == max(k for k in range(1, 200) if zcdp_to_dp(k / 800, 1e-6) <= 1.0)
    assert counts["pld"] >= counts["rdp"] >= counts["basic"]
    texts = svg_texts(chart)
    assert "remaining budget ε = 1" in texts
    assert any(t.startswith("What if: 30 queries, each a Gaussian") for t in texts)
    assert {label(n) for n in CURVES} <= texts


def test_whatif_png_chart(empty: Path) -> None:
    chart = empty.parent / "whatif.png"
    result = run(
        empty, "budget", "what-if", "--epsilon", "0.1", "--queries", "40", "--chart", str(chart)
    )
    assert result.exit_code == 0, result.output
    check_png(chart)


@pytest.mark.parametrize(
    "args",
    [
        ("--queries", "5"),
        ("--epsilon", "0.1", "--sigma", "2", "--queries", "5"),
        ("--epsilon", "-1", "--queries", "5"),
        ("--epsilon", "0.1", "--queries", "0"),
    ],
)
def test_whatif_usage_errors(empty: Path, args: tuple[str, ...]) -> None:
    result = run(empty, "budget", "what-if", *args)
    assert result.exit_code == 2, result.output


def test_fit_count_finds_the_largest_fitting_number() -> None:
    assert fit_count(lambda k: k <= 37) == 37
    assert fit_count(lambda k: k <= 1) == 1
    assert fit_count(lambda k: False) == 0
    assert fit_count(lambda k: True, most=1000) == 1000
    assert fit_count(lambda k: k <= 999, most=1000) == 999


# -- HTML report ------------------------------------------------------------------------------
VOID = {"meta", "br", "hr", "img", "input", "link"}


class Strict(HTMLParser):
    """Fails on an unbalanced tag; collects headings' text and the attributes that load."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.headings: list[str] = []
        self.loads: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.loads += [v or "" for k, v in attrs if k in ("src", "href", "xlink:href")]
        if tag not in VOID:
            self.stack.append(tag)
        if tag in ("h1", "h2", "h3"):
            self.headings.append("")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.loads += [v or "" for k, v in attrs if k in ("src", "href", "xlink:href")]

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if any(t in ("h1", "h2", "h3") for t in self.stack[-2:]):
            self.headings[-1] += data


def test_html_report_has_every_markdown_section_and_parses(policy: Path) -> None:
    loaded = load_policy(policy)
    budget = budget_for(loaded.dataset.id, loaded.budget, open_store(loaded))
    data = build_report(loaded, budget)
    markdown = render_markdown(data)
    for page in (render_html(data), render_html(data, history_curves(budget))):
        parser = Strict()
        parser.feed(page)
        parser.close()
        assert parser.stack == []
        sections = [
            line.lstrip("#").strip().replace("`", "")
            for line in markdown.splitlines()
            if line.startswith("#")
        ]
        assert [h for h in parser.headings if h != "Composition chart"] == sections
        assert "Composition chart" in parser.headings
        assert page.count("<table>") == markdown.count("\n|---")
        assert "svg" in parser.tags and not {"script", "img", "link"} & parser.tags
        assert all(target.startswith("#") for target in parser.loads)  # nothing external
        for sql, _ in QUERIES:
            assert sql.replace(">", "&gt;") in page  # table cells: text, no emphasis


def test_the_html_report_s_audit_section_names_who_overrode_what(policy: Path) -> None:
    """The audit section: each charge on bounds other than the policy's with its analyst and
    what differs, and the charges no analyst named (the fixture's three)."""
    with dpsql.connect(policy, analyst="ann") as conn:
        conn.cursor().execute(
            "SELECT region, COUNT(*) AS n FROM visits GROUP BY region",
            max_groups_per_unit=4,
            max_rows_per_unit_per_group=3,
        )
    loaded = load_policy(policy)
    budget = budget_for(loaded.dataset.id, loaded.budget, open_store(loaded))
    page = render_html(build_report(loaded, budget))
    audit = page.split("<h2>Audit</h2>", 1)[1].split("<h2>", 1)[0]
    cells = re.findall(r"<td>(.*?)</td>", audit)
    assert cells[2:5] == [
        "ann",
        "SELECT region, COUNT(*) AS n FROM visits GROUP BY region",
        "L0 of visits 4 (policy 2); C of visits 3 (policy 10)",
    ]
    assert "Charges by no named analyst: 3, epsilon 0.4 in all" in audit
    assert "<code>budget.require_analyst = true</code>" in audit


def test_the_default_html_chart_is_basic_composition_of_the_schedule(policy: Path) -> None:
    loaded = load_policy(policy)
    data = build_report(loaded, budget_for(loaded.dataset.id, loaded.budget, open_store(loaded)))
    curves = schedule_curves(data)
    assert curves.queries == (0, 1, 2, 3)
    assert curves.epsilons == {"basic": (0.0, 0.1, 0.2, 0.4)}
    assert (curves.cap, curves.delta) == (1.0, 1e-6)


def test_the_default_chart_composes_pinned_cells_in_parallel() -> None:
    def charge(epsilon: str, cell: list[str] | None) -> dict[str, object]:
        return {"kind": "charge", "epsilon": epsilon, "cell": cell}

    data = {
        "dataset": {"id": "d"},
        "budget": {"diagnose": False, "epsilon": {"total": "2"}},
        "accounting": {"delta": "1/1000000"},
        "schedule": [
            charge("0.1", None),
            {"kind": "budget_add", "epsilon": "1", "delta": "0"},
            charge("0.2", ["visits.region@1", "east"]),
            charge("0.3", ["visits.region@1", "west"]),
            charge("0.1", None),
            charge("0.25", ["visits.region@1", "east"]),
            charge("0.05", ["visits.home@1", "north"]),  # another family: sequential
        ],
    }
    readings = schedule_curves(data).epsilons["basic"]
    assert readings == pytest.approx((0, 0.1, 0.3, 0.4, 0.5, 0.65, 0.7))
    # Cells an earlier version keyed by the literal's text, (table, column, value), may share
    # units: they compose sequentially.
    for entry in data["schedule"]:
        if isinstance(entry.get("cell"), list):
            entry["cell"] = ["visits", "region", entry["cell"][1]]
    readings = schedule_curves(data).epsilons["basic"]
    assert readings == pytest.approx((0, 0.1, 0.3, 0.6, 0.7, 0.95, 1.0))


def test_html_escapes_what_it_shows(policy: Path) -> None:
    loaded = load_policy(policy)
    data = build_report(loaded, budget_for(loaded.dataset.id, loaded.budget, open_store(loaded)))
    data["schedule"][0]["query"] = "SELECT '<script>x</script>' | `y`"
    page = render_html(data)
    assert "<script>" not in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page


# -- demo -------------------------------------------------------------------------------------
def test_demo_runs_the_example() -> None:
    result = CliRunner().invoke(group(), ["demo"])
    assert result.exit_code == 0, result.output
    assert "## Budget of data set visits-example" in result.output
    assert "refused (BudgetExceededError)" in result.output


def test_demo_generates_missing_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("demo.py", "make_data.py", "policy.toml"):
        shutil.copy(ROOT / "examples" / name, tmp_path / name)
    monkeypatch.setattr(budget_view, "DEMO_USERS", 2_000)
    result = CliRunner().invoke(group(), ["demo", "--examples", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "generating the example data" in result.output
    assert (tmp_path / "data" / "visits.parquet").exists()
    assert "## Budget of data set visits-example" in result.output


def test_demo_outside_a_checkout_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(group(), ["demo", "--examples", str(tmp_path)])
    assert result.exit_code == 2
    assert "no demo.py" in result.stderr


# -- docs -------------------------------------------------------------------------------------
def _docs() -> str:
    """docs/cli.md, and docs/cli_budget.md until it is merged into it."""
    paths = [ROOT / "docs" / "cli.md", ROOT / "docs" / "cli_budget.md"]
    return "\n".join(p.read_text(encoding="utf-8") for p in paths if p.exists())


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("dpsql budget show", show_command),
        ("dpsql budget what-if", whatif_command),
        ("dpsql demo", demo_command),
    ],
)
def test_every_option_is_documented_in_its_section(name: str, command: click.Command) -> None:
    match = re.search(rf"^## `{re.escape(name)}`\s*$(.*?)(?=^## |\Z)", _docs(), re.M | re.S)
    assert match, f"no section '## `{name}`'"
    for param in command.params:
        for opt in param.opts:
            assert f"`{opt}" in match.group(1), f"{name}: {opt} is not documented"


def test_the_docs_show_the_example_chart() -> None:
    assert "](budget-chart.png)" in _docs()
    check_png(ROOT / "docs" / "budget-chart.png")
    texts = svg_texts(ROOT / "docs" / "budget-chart.svg")
    assert "number of queries" in texts and {label(n) for n in CURVES} <= texts


def test_budget_alone_shows_the_budget(policy: Path) -> None:
    shown = CliRunner().invoke(cli.cli, ["--policy", str(policy), "budget"])
    explicit = CliRunner().invoke(cli.cli, ["--policy", str(policy), "budget", "show"])
    assert shown.exit_code == 0, shown.output
    assert shown.output == explicit.output and "decides" in shown.output


def test_bare_budget_takes_the_options_of_show(policy: Path) -> None:
    """``dpsql budget --chart F`` is ``dpsql budget show --chart F`` (the real command group)."""
    chart = policy.parent / "bare.svg"
    result = CliRunner().invoke(cli.cli, ["--policy", str(policy), "budget", "--chart", str(chart)])
    assert result.exit_code == 0, result.output
    assert "budget cap ε = 1" in svg_texts(chart)
    misplaced = CliRunner().invoke(
        cli.cli, ["--policy", str(policy), "budget", "--chart", str(chart), "what-if"]
    )
    assert misplaced.exit_code == 2 and "--chart goes with" in misplaced.output


def test_the_chart_marks_top_ups_and_the_cap_as_it_was(policy: Path) -> None:
    added = CliRunner().invoke(
        cli.cli,
        ["--policy", str(policy), "budget", "add", "--epsilon", "0.5", "--delta", "0",
         "--by", "olga", "--why", "more"],
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    with dpsql.connect(policy) as conn:
        conn.cursor().execute("SELECT COUNT(*) FROM visits WHERE age > 40", epsilon="0.1")
    loaded = load_policy(policy)
    budget = budget_for(loaded.dataset.id, loaded.budget, open_store(loaded))
    curves = history_curves(budget)
    charged = len(QUERIES)
    assert curves.cap_steps == ((0, 1.0), (charged, 1.5))
    assert curves.cap == 1.5 and curves.queries[-1] == charged + 1
    chart = policy.parent / "topped.svg"
    write_chart(curves, chart)
    assert "top-up" in svg_texts(chart)
