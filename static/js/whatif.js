/* A what-if run: poll its state, show progress, then the comparison report. */
(function () {
  "use strict";
  const { fetchJSON, el, seconds } = window.PortalLive;
  const { maxOf, axis, countAxis, percentAxis, durationUnit, cdf, note, draw, showEmpty } = window.PortalCharts;
  const root = document.getElementById("whatif-run");
  if (!root) return;
  const url = "/whatif/" + root.dataset.run + ".json";
  // As many colours as a comparison has runs (3 policies x 3 placements fit).
  const COLOURS = ["#2f6fed", "#e4572e", "#17a398", "#9b5de5", "#f3a712", "#d81159", "#3bb273", "#8f2d56", "#0081a7", "#c2711f", "#5c6bc0", "#6a994e"];
  const pct = (v) => (v * 100).toFixed(1) + "%";

  function report(r) {
    document.getElementById("whatif-progress").hidden = true;
    document.getElementById("whatif-report").hidden = false;
    const body = document.querySelector("#whatif-table tbody");
    body.replaceChildren(...r.results.map((p) => {
      const s = p.summary, tr = el("tr", { "data-policy": p.policy });
      for (const v of [p.label || p.policy, s.jobs, seconds(s.avg_jct), seconds(s.median_jct), seconds(s.p95_jct), seconds(s.avg_queueing_delay), seconds(s.makespan), pct(s.gpu_utilization), pct(s.cluster_efficiency), s.preemptions, s.scale_events]) tr.appendChild(el("td", {}, v));
      return tr;
    }));
    document.getElementById("whatif-note").textContent = r.jobs + " jobs replayed on " + r.total_gpus + " GPUs" + (r.elastic ? " (elastic)" : "") + (r.dropped_too_wide ? "; " + r.dropped_too_wide + " jobs wider than the cluster left out" : "") + ".";
    drawCharts(r);
  }

  /** Why a series has no points, in words (a run of zero jobs, or none that finished). */
  function whyEmpty(r) {
    if (r.jobs === 0 && r.dropped_too_wide) return "every job in the trace is wider than the cluster's " + r.total_gpus + " GPUs";
    if (r.jobs === 0) return "the trace has no jobs";
    return "no job finished in the simulation";
  }

  /** Draw ``traces`` (one per policy); a policy without points is named in a note, and a
   * chart where no policy has any says why instead of showing an empty box. */
  function drawSeries(id, traces, r, layout) {
    const missing = traces.filter((t) => !t.x.length).map((t) => t.name);
    if (missing.length === traces.length) { showEmpty(id, "Nothing to draw: " + whyEmpty(r) + "."); return; }
    const notes = missing.length ? [note("No points for " + missing.join(", ") + ": " + whyEmpty(r))] : [];
    const shown = traces.filter((t) => t.x.length);
    // The plot keeps 250 px; the legend (a row per run at worst, in a narrow card) goes below the
    // x-axis title, inside a bottom margin that grows with the runs, so it never covers the title.
    const bottom = 70 + 20 * shown.length;
    const legend = { orientation: "h", x: 0, xanchor: "left", y: -0.24, yanchor: "top" };
    draw(id, shown, Object.assign({ showlegend: true, legend: legend, height: 260 + bottom, margin: { l: 56, r: 16, t: 10, b: bottom }, annotations: notes }, layout));
  }

  function drawCharts(r) {
    const longest = maxOf(r.results.map((p) => maxOf(p.jct_cdf, 0)), 0);
    const unit = durationUnit(longest);
    const cdfs = [], queue = [], eff = [];
    let mostQueued = 1;
    r.results.forEach((p, i) => {
      const c = COLOURS[i % COLOURS.length];
      const points = cdf(p.jct_cdf.slice().sort((a, b) => a - b), unit.seconds);
      const name = p.label || p.policy;
      cdfs.push({ x: points.x, y: points.y, name: name, mode: "lines+markers", marker: { size: 4 }, line: { shape: "hv", color: c }, hovertemplate: name + ": %{y:.0%} within %{x:.3~f} " + unit.unit + "<extra></extra>" });
      const t = (p.series.t || []).map((v) => v / 3600);
      const queued = p.series.queued || [];
      mostQueued = Math.max(mostQueued, maxOf(queued, 0));
      queue.push({ x: t, y: queued, name: name, mode: "lines", line: { shape: "hv", color: c } });
      eff.push({ x: t, y: (p.series.efficiency || []).map((v) => v / r.total_gpus), name: name, mode: "lines", line: { color: c } });
    });
    drawSeries("whatif-cdf", cdfs, r, { xaxis: axis("JCT (" + unit.unit + ")", { type: "log" }), yaxis: percentAxis("Jobs finished within") });
    drawSeries("whatif-queue", queue, r, { xaxis: axis("Simulated time (h)", { rangemode: "tozero" }), yaxis: countAxis("Jobs queued", mostQueued) });
    drawSeries("whatif-eff", eff, r, { xaxis: axis("Simulated time (h)", { rangemode: "tozero" }), yaxis: percentAxis("Cluster efficiency") });
  }

  async function poll() {
    let state;
    try { state = await fetchJSON(url); } catch (e) { setTimeout(poll, 2000); return; }
    const percent = (state.progress * 100).toFixed(0);
    document.getElementById("whatif-bar").style.width = percent + "%";
    document.getElementById("whatif-progressbar").setAttribute("aria-valuenow", percent);
    document.getElementById("whatif-step").textContent = state.status === "queued" ? "Waiting for a worker…" : state.step || state.status;
    if (state.status === "done") { report(state.report); return; }
    if (state.status === "failed") {
      document.getElementById("whatif-progress").hidden = true;
      const box = document.getElementById("whatif-error");
      box.hidden = false;
      box.textContent = "The run failed: " + state.error;
      return;
    }
    setTimeout(poll, 700);
  }
  poll();
})();
