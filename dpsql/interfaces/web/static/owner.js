// The owner's page: the budget over time under each accountant, what-if sliders, a pasted
// batch file's cost, shares (changed with the password again and a confirmation), the ledger's
// verification, the data check, the audit and the schedule.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const { call, el, fill } = dpsql;
  const EPSILONS = Array.from({ length: 41 }, (_, i) => Number((0.01 * Math.pow(10, (i * 3) / 40)).toPrecision(2)));
  const QUERIES = Array.from({ length: 41 }, (_, i) => Math.max(1, Math.round(Math.pow(10, (i * 3) / 40))));  // 1 to 1000

  function draw(target, curves) {
    const series = curves.curves.map((c) => ({ name: c.name, xs: curves.queries, ys: c.epsilons }));
    dpsql.lines(target, series, curves.cap, curves.cap_label, "queries");
  }

  async function overview() {
    const o = await call("GET", "/api/owner/overview");
    $("glance").textContent = o.glance;
    draw($("budget-chart"), o.curves);
    fill($("figures").tBodies[0], o.figures.map((f) => [f.accountant, isNaN(Number(f.epsilon)) ? f.epsilon : Number(Number(f.epsilon).toPrecision(4)), f.note]));
    fill($("shares").tBodies[0], Object.entries(o.analysts).map(([name, a]) => [
      name, a.share ? a.share.epsilon : "(none)", a.share ? a.share.delta : "", a.share ? a.share.set_by : "",
      a.queries, a.epsilon_charged]));
    fill($("audit").tBodies[0], o.audit.overrides.map((a) => [a.seq, a.time, a.analyst || "(no name)", a.query,
      a.overrides.map((x) => Object.entries(x).map(([k, v]) => k + " " + v).join(", ")).join("; ")]));
    $("audit-unnamed").textContent = o.audit.unnamed_charges ? o.audit.unnamed_charges + " charge(s) by no named analyst" : "";
    fill($("schedule").tBodies[0], o.schedule.map((s) => [s.seq, s.time, s.kind, s.analyst || "",
      s.query || (s.share_of ? "share of " + s.share_of + ": epsilon " + s.epsilon + " (" + s.why + ")" : s.why || "")]));
  }

  let pending = null;
  async function whatif() {
    const epsilon = EPSILONS[Number($("wi-epsilon").value)], queries = QUERIES[Number($("wi-queries").value)];
    $("wi-epsilon-value").textContent = String(epsilon);
    $("wi-queries-value").textContent = String(queries);
    const asked = epsilon + "/" + queries;
    pending = asked;
    const w = await call("GET", "/api/owner/whatif?epsilon=" + encodeURIComponent(epsilon) + "&queries=" + queries);
    if (pending !== asked) return; // a newer position of the sliders was asked since
    draw($("whatif-chart"), w.curves);
    $("whatif-chart").dataset.asked = asked;
    fill($("whatif-table").tBodies[0], w.theorems.map((t) => [t.name, t.after === null ? "unbounded" : Number(t.after.toPrecision(4)), t.fit, t.label]));
  }

  let timer = null;
  for (const id of ["wi-epsilon", "wi-queries"]) {
    $(id).addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => whatif().catch(report("batch-out")), 150);
    });
  }

  function report(id) {
    return (e) => { $(id).textContent = (e.kind ? e.kind + ": " : "") + e.message; $(id).className = "error"; };
  }

  $("batch-cost").addEventListener("click", async () => {
    try {
      const b = await call("POST", "/api/owner/batch", { text: $("batch").value, analyst: $("batch-analyst").value });
      $("batch-out").className = b.refused ? "error" : "";
      $("batch-out").textContent = b.epsilon === null
        ? b.statements + " statement(s), " + (b.refused ? b.refused + " refused now: " + b.why_not_more : "nothing to charge: every answer is released already")
        : b.statements + " statement(s), " + b.charged + " charged, " + b.free + " served free; one run costs epsilon " +
          b.epsilon + ", delta " + b.delta + "; the " + b.accountant + " filter admits " + (b.at_least ? "at least " : "") +
          b.refreshes + " refresh(es) from now" + (b.why_not_more ? " (then: " + b.why_not_more + ")" : "");
    } catch (e) { report("batch-out")(e); }
  });

  $("share-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!$("share-confirm").checked) { $("share-out").className = "error"; $("share-out").textContent = "tick the confirmation first"; return; }
    try {
      const r = await call("POST", "/api/owner/allocate", {
        analyst: $("share-analyst").value, epsilon: $("share-epsilon").value, delta: $("share-delta").value,
        why: $("share-why").value, password: $("share-password").value, confirm: true,
        mode: $("share-mode-top-up").checked ? "top up" : "set" });
      $("share-out").className = "";
      $("share-out").textContent = "ledger record " + r.record + ": " + r.text;
      $("share-password").value = "";
      $("share-confirm").checked = false;
      await overview();
    } catch (e) { report("share-out")(e); }
  });

  $("verify").addEventListener("click", async () => {
    try {
      const v = await call("POST", "/api/owner/verify", {});
      $("verify-out").className = "";
      $("verify-out").textContent = v.text + "; head " + v.head.slice(0, 16);
    } catch (e) { report("verify-out")(e); }
  });

  $("check").addEventListener("click", async () => {
    $("check-out").textContent = "checking...";
    try {
      const c = await call("POST", "/api/owner/check", {});
      $("check-out").className = c.status === 0 ? "" : "warning";
      $("check-out").textContent = c.status === 0 ? "clean" : "findings (status " + c.status + ")";
      $("check-report").hidden = false;
      $("check-report").textContent = JSON.stringify(c.report, null, 2);
    } catch (e) { report("check-out")(e); }
  });

  overview().catch(report("glance"));
  whatif().catch(report("batch-out"));
})();
