"""The console in a real headless Chromium (Debian's ``chromium`` and ``chromedriver``, which
``make test`` installs when missing), driven through WebDriver: an analyst logs in, previews,
runs, reads the ± and the mostly-noise flags, sees the chart, downloads, is served a cached
answer free and is refused with what to do; the owner sets a share, moves the what-if sliders
and sees the curves change, verifies the ledger and downloads the report. Data values that hold
markup must show as text and never run (``window.__xss`` stays unset).

``DPSQL_SCREENSHOTS=1`` also writes the two pages' screenshots into docs/.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from web_fixtures import HOSTILE, PASSWORDS, make_folder, served

pytestmark = [pytest.mark.xdist_group("web")]
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
if CHROMIUM is None or DRIVER is None:
    pytest.skip("needs Debian's chromium and chromium-driver (make test installs them)",
                allow_module_level=True)  # fmt: skip

from selenium import webdriver  # noqa: E402 - after the skip: the browser is needed
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GROUPED = "SELECT region, COUNT(*) AS visits, SUM(spend) AS spend FROM visits GROUP BY region"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with served(make_folder(tmp_path_factory.mktemp("webui"))) as url:
        yield url


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--window-size=1280,1600",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):  # fmt: skip
        options.add_argument(flag)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=options)
    driver.execute_cdp_cmd(
        "Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    driver.downloads = downloads
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: Any, check: Any, timeout: float = 30) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(check)


def _login(driver: Any, site: str, name: str) -> None:
    driver.get(site + "/login")
    driver.find_element(By.ID, "login-name").send_keys(name)
    driver.find_element(By.ID, "login-password").send_keys(PASSWORDS[name])
    driver.find_element(By.ID, "login-submit").click()
    _wait(driver, lambda d: d.current_url.endswith("/owner" if name == "olga" else "/analyst"))


def _text(driver: Any, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def _type_sql(driver: Any, sql: str) -> None:
    box = driver.find_element(By.ID, "sql")
    box.clear()
    box.send_keys(sql)


def _run(driver: Any, sql: str) -> None:
    old = driver.execute_script("return document.getElementById('cost').textContent")
    driver.execute_script("document.getElementById('cost').textContent = ''")
    _type_sql(driver, sql)
    driver.find_element(By.ID, "run").click()
    _wait(driver, lambda d: _text(d, "cost") or d.find_element(By.ID, "error").is_displayed())
    del old


def _downloaded(driver: Any, suffix: str) -> Path:
    def done(_: Any) -> Path | None:
        files = [p for p in driver.downloads.iterdir() if p.name.endswith(suffix)]
        return files[0] if files else None

    return Path(_wait(driver, done))


def _shot(driver: Any, name: str) -> None:
    if os.environ.get("DPSQL_SCREENSHOTS"):
        driver.save_screenshot(str(ROOT / "docs" / name))


def test_an_analyst_previews_runs_downloads_and_is_refused(browser: Any, site: str) -> None:
    _login(browser, site, "alice")
    _wait(browser, lambda d: "share" in _text(d, "share-text"))
    # Preview: free, with the cost, the ± and the verdict.
    _type_sql(browser, GROUPED)
    browser.find_element(By.ID, "preview").click()
    _wait(browser, lambda d: _text(d, "verdict"))
    assert "fits your share" in _text(browser, "verdict")
    assert "noise ±" in _text(browser, "preview-lines")
    assert "epsilon" in _text(browser, "preview-cost")
    # Run: the answer with its ±, hostile keys shown as text, a chart with error bars.
    _run(browser, GROUPED)
    assert _text(browser, "cost").startswith("charged epsilon")
    table = _text(browser, "answer-table")
    assert "±" in table
    for value in HOSTILE:
        assert value in table
    assert browser.execute_script("return window.__xss") is None
    bars = browser.find_elements(By.CSS_SELECTOR, "#chart rect")
    errors = browser.find_elements(By.CSS_SELECTOR, "#chart line[data-error-bar]")
    assert len(bars) == 7 and len(errors) == 7
    _shot(browser, "web-analyst.png")
    # Downloads, with the ± columns.
    browser.find_element(By.ID, "download-csv").click()
    csv = _downloaded(browser, ".csv").read_text(encoding="utf-8")
    assert csv.splitlines()[0] == "region,visits,visits ±,visits noise,spend,spend ±,spend noise"
    browser.find_element(By.ID, "download-parquet").click()
    assert _downloaded(browser, ".parquet").read_bytes()[:4] == b"PAR1"
    # The same question again: served free, from whoever's release, said so and no more.
    _run(browser, GROUPED)
    assert _text(browser, "cost").startswith("served free from an earlier release")
    # A value that is mostly noise is flagged.
    _run(browser, "SET dpsql.epsilon = 0.01")
    _run(browser, "SELECT region, COUNT(*) FROM visits WHERE spend > 148 GROUP BY region")
    assert browser.find_elements(By.CSS_SELECTOR, "#answer-table td.noisy")
    assert "mostly noise" in _text(browser, "noise-note")
    # A refusal that says what to do, and nothing charged.
    _run(browser, "SET dpsql.epsilon = 2.9")
    _run(browser, "SELECT COUNT(*) FROM visits")
    error = _text(browser, "error")
    assert error.startswith("BudgetExceededError") and "largest epsilon that fits" in error
    # The share gauge and the analyst's own history.
    _wait(browser, lambda d: float(d.find_element(By.ID, "share-gauge").get_attribute("value")) > 0)
    history = _text(browser, "history")
    assert "GROUP BY region" in history and "served free" in history
    assert "charged epsilon 0.55, delta 0" in history


def test_the_owner_sets_a_share_moves_the_sliders_verifies_and_reports(
    browser: Any, site: str
) -> None:
    _login(browser, site, "olga")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#budget-chart path[data-curve]"))
    names = {
        e.get_attribute("data-curve")
        for e in browser.find_elements(By.CSS_SELECTOR, "#budget-chart path")
    }
    assert {"basic", "advanced", "rdp", "pld"} <= names  # the report's curves
    # What-if: move the queries slider and watch every curve redrawn.
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#whatif-chart path"))
    before = {
        e.get_attribute("data-curve"): e.get_attribute("d")
        for e in browser.find_elements(By.CSS_SELECTOR, "#whatif-chart path")
    }
    asked = browser.find_element(By.ID, "whatif-chart").get_attribute("data-asked")
    fits = _text(browser, "whatif-table")
    slider = browser.find_element(By.ID, "wi-epsilon")
    for _ in range(6):
        slider.send_keys("\ue014")  # the right arrow: a larger per-query epsilon
    _wait(
        browser,
        lambda d: d.find_element(By.ID, "whatif-chart").get_attribute("data-asked") != asked,
    )
    after = {
        e.get_attribute("data-curve"): e.get_attribute("d")
        for e in browser.find_elements(By.CSS_SELECTOR, "#whatif-chart path")
    }
    assert set(after) == set(before) == {"basic", "advanced", "rdp", "zcdp", "pld"}
    assert all(after[n] != before[n] for n in before)
    assert _text(browser, "whatif-table") != fits
    _shot(browser, "web-owner.png")
    # A pasted batch file's cost and refreshes.
    browser.find_element(By.ID, "batch").send_keys(
        "SELECT COUNT(*) FROM visits; SELECT region, AVG(spend) FROM visits GROUP BY region"
    )
    browser.find_element(By.ID, "batch-analyst").send_keys("alice")
    browser.find_element(By.ID, "batch-cost").click()
    _wait(browser, lambda d: "refresh" in _text(d, "batch-out"))
    # A share: the password again and a confirmation.
    for field, value in (("share-analyst", "bob"), ("share-epsilon", "1.5"),
                         ("share-delta", "1e-7"), ("share-why", "a second study"),
                         ("share-password", PASSWORDS["olga"])):  # fmt: skip
        box = browser.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    browser.find_element(By.ID, "share-set").click()
    assert "confirmation" in _wait(browser, lambda d: _text(d, "share-out"))
    browser.find_element(By.ID, "share-confirm").click()
    browser.find_element(By.ID, "share-set").click()
    _wait(browser, lambda d: "ledger record" in _text(d, "share-out"))
    _wait(browser, lambda d: "ledger record" in _text(d, "shares"))
    row = next(r for r in _text(browser, "shares").splitlines() if r.startswith("bob"))
    assert "3/2" in row or "1.5" in row
    # The ledger verified; the report downloaded.
    browser.find_element(By.ID, "verify").click()
    assert ": ok" in _wait(browser, lambda d: _text(d, "verify-out"))
    browser.find_element(By.ID, "report").click()
    report = _downloaded(browser, ".html").read_text(encoding="utf-8")
    assert "Privacy report" in report and "a second study" in report
    assert browser.execute_script("return window.__xss") is None


def test_a_quantile_s_interval_is_drawn_and_an_ended_login_goes_back_to_the_form(
    browser: Any, site: str
) -> None:
    _login(browser, site, "bob")
    _run(browser, "SELECT region, MEDIAN(spend) AS m FROM visits GROUP BY region")
    assert "[" in _text(browser, "answer-table")  # value [lo, hi], never a ±
    ends = [
        [float(x) for x in e.get_attribute("data-error-bar").split()]
        for e in browser.find_elements(By.CSS_SELECTOR, "#chart line[data-error-bar]")
    ]
    assert len(ends) == 7 and all(lo <= hi for lo, hi in ends)
    browser.delete_cookie("dpsql_login")
    _type_sql(browser, GROUPED)
    browser.find_element(By.ID, "preview").click()
    _wait(browser, lambda d: d.current_url.endswith("/login"))


def test_markup_in_the_query_text_stays_text(browser: Any, site: str) -> None:
    _login(browser, site, "bob")
    sql = 'SELECT COUNT(*) AS "<img src=x onerror=window.__xss=3>" FROM visits'
    _run(browser, sql)
    assert "<img src=x onerror=window.__xss=3>" in _text(browser, "answer-table")
    browser.refresh()
    _wait(browser, lambda d: "onerror" in _text(d, "history"))
    time.sleep(0.2)
    assert browser.execute_script("return window.__xss") is None
