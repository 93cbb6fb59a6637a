/* A what-if run: poll its state, show progress, then the comparison report. */
(function () {
  "use strict";
  const { fetchJSON, el, seconds, plotLayout } = window.PortalLive;
  const root = document.getElementById("whatif-run");
  if (!root) return;
  const url = "/whatif/" + root.dataset.run + ".json";
  const config = { displayModeBar: false, responsive: true };
  const COLOURS = ["#2f6fed", "#e4572e", "#17a398", "#9b5de5", "#f3a712", "#d81159"];
  const pct = (v) => (v * 100).toFixed(1) + "%";

  function report(r) {
    document.getElementById("whatif-progress").hidden = true;
    document.getElementById("whatif-report").hidden = false;
    const body = document.querySelector("#whatif-table tbody");
    body.replaceChildren(...r.results.map((p) => {
      const s = p.summary, tr = el("tr", { "data-policy": p.policy });
      for (const v of [p.policy, s.jobs, seconds(s.avg_jct), seconds(s.median_jct), seconds(s.p95_jct), seconds(s.avg_queueing_delay), seconds(s.makespan), pct(s.gpu_utilization), pct(s.cluster_efficiency), s.preemptions, s.scale_events]) tr.appendChild(el("td", {}, v));
      return tr;
    }));
    document.getElementById("whatif-note").textContent = r.jobs + " jobs replayed on " + r.total_gpus + " GPUs" + (r.elastic ? " (elastic)" : "") + (r.dropped_too_wide ? "; " + r.dropped_too_wide + " jobs wider than the cluster left out" : "") + ".";
    const cdf = [], queue = [], eff = [];
    r.results.forEach((p, i) => {
      const c = COLOURS[i % COLOURS.length];
      cdf.push({ x: p.jct_cdf, y: p.jct_cdf.map((_, k) => (k + 1) / p.jct_cdf.length), name: p.policy, mode: "lines", line: { shape: "hv", color: c } });
      const t = (p.series.t || []).map((v) => v / 3600);
      queue.push({ x: t, y: p.series.queued, name: p.policy, mode: "lines", line: { shape: "hv", color: c } });
      eff.push({ x: t, y: (p.series.efficiency || []).map((v) => v / r.total_gpus), name: p.policy, mode: "lines", line: { color: c } });
    });
    const legend = { showlegend: true, legend: { orientation: "h", y: -0.3 }, height: 330, margin: { l: 50, r: 16, t: 10, b: 90 } };
    Plotly.react("whatif-cdf", cdf, plotLayout(Object.assign({ xaxis: { title: "JCT (s)", type: "log", gridcolor: "#e3e6eb" }, yaxis: { range: [0, 1.02], tickformat: ".0%", gridcolor: "#e3e6eb" } }, legend)), config);
    Plotly.react("whatif-queue", queue, plotLayout(Object.assign({ xaxis: { title: "hours", gridcolor: "#e3e6eb" }, yaxis: { title: "queued", rangemode: "tozero", gridcolor: "#e3e6eb" } }, legend)), config);
    Plotly.react("whatif-eff", eff, plotLayout(Object.assign({ xaxis: { title: "hours", gridcolor: "#e3e6eb" }, yaxis: { title: "efficiency", rangemode: "tozero", tickformat: ".0%", gridcolor: "#e3e6eb" } }, legend)), config);
  }

  async function poll() {
    let state;
    try { state = await fetchJSON(url); } catch (e) { setTimeout(poll, 2000); return; }
    document.getElementById("whatif-bar").style.width = (state.progress * 100).toFixed(0) + "%";
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
