// The analyst's page: preview (free), run, the answer with its ± and flags, a chart of a
// grouped answer with error bars, downloads, the share gauge and the analyst's own history.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const { call, el, fill } = dpsql;

  function showError(error) {
    $("error").hidden = false;
    $("error").textContent = (error.kind ? error.kind + ": " : "") + error.message;
  }

  async function refreshMine() {
    const mine = await call("GET", "/api/me");
    const share = mine.share || mine.dataset;
    $("share-gauge").max = share.epsilon;
    $("share-gauge").value = Math.min(share.spent, share.epsilon);
    $("share-text").textContent = mine.share ? mine.share.text + "; set by " + mine.share.set_by : "no share of your own: " + mine.dataset.text;
    $("dataset-text").textContent = mine.budget;
    fill($("history").tBodies[0], mine.history.map((h) => [h.time, h.query, h.cost]));
  }

  $("preview").addEventListener("click", async () => {
    $("error").hidden = true;
    try {
      const p = await call("POST", "/api/preview", { sql: $("sql").value });
      $("preview-out").hidden = false;
      $("verdict").textContent = p.verdict;
      $("verdict").className = p.fits ? "" : "error";
      $("preview-cost").textContent = p.served_free ? "cost: nothing" : "cost: epsilon " + p.epsilon + ", delta " + p.delta;
      $("preview-lines").replaceChildren(...p.lines.map((line) => el("li", line)));
    } catch (e) { $("preview-out").hidden = true; showError(e); }
  });

  function chart(answer) {
    const target = $("chart");
    target.hidden = true;
    if (answer.rows.length < 2 || answer.columns.length < 2) return;
    const numeric = answer.columns.findIndex((_, i) => answer.rows.every((r) => typeof r[i].value === "number") && answer.rows.some((r) => r[i].accuracy !== null));
    if (numeric < 0) return;
    const key = answer.columns.findIndex((_, i) => i !== numeric && answer.rows.every((r) => typeof r[i].value !== "number" || r[i].accuracy === null));
    if (key < 0) return;
    const accuracy = answer.rows.map((r) => r[numeric].accuracy);
    dpsql.bars(target, answer.rows.map((r) => r[key].text), answer.rows.map((r) => r[numeric].value), accuracy);
    target.hidden = false;
  }

  function show(answer) {
    $("answer").hidden = false;
    $("cost").textContent = answer.cost || answer.message;
    $("bounds-note").textContent = answer.note || "";
    const table = $("answer-table");
    table.replaceChildren();
    const head = el("thead"), tr = el("tr");
    answer.columns.forEach((c) => tr.appendChild(el("th", c)));
    head.appendChild(tr);
    const body = el("tbody");
    let noisy = 0;
    answer.rows.forEach((row) => {
      const r = el("tr");
      row.forEach((cell) => {
        const td = el("td", cell.text, typeof cell.value === "number" ? "num" : "");
        if (cell.noise) { td.classList.add("noisy"); td.title = "mostly noise"; noisy++; }
        r.appendChild(td);
      });
      body.appendChild(r);
    });
    table.append(head, body);
    $("noise-note").hidden = noisy === 0;
    $("noise-note").textContent = noisy + " value(s) are mostly noise (marked): their ± is as large as they are.";
    const has = Boolean(answer.id);
    for (const fmt of ["csv", "parquet"]) {
      const link = $("download-" + fmt);
      link.hidden = !has;
      if (has) link.href = "/api/answers/" + encodeURIComponent(answer.id) + "." + fmt;
    }
    chart(answer);
  }

  $("run").addEventListener("click", async () => {
    $("error").hidden = true;
    try {
      show(await call("POST", "/api/run", { sql: $("sql").value }));
    } catch (e) { showError(e); }
    refreshMine().catch(showError);
  });

  refreshMine().catch(showError);
})();
