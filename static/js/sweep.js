/* The sweep page's charts, from its JSON snapshot (#sweep-snapshot, built by jobs.sweep_views):
 *
 *   curves      one line per trial: the metric against step, over all its jobs
 *   parcoords   one axis per hyperparameter, then the metric; a line per trial with a result
 *
 * Drawn with PortalCharts (static/js/charts.js); text only through Plotly's own labels,
 * no innerHTML. A running sweep's page reloads every 10 s to show new results. */
(function () {
  "use strict";
  const node = document.getElementById("sweep-snapshot");
  if (!node || !window.PortalCharts) return;
  const snap = JSON.parse(node.textContent);
  const charts = window.PortalCharts;

  function label(trial) {
    const params = Object.entries(trial.params).map(([k, v]) => k + "=" + v).join(", ");
    return "#" + trial.index + " " + params;
  }

  function drawCurves() {
    const traces = snap.trials
      .filter((t) => (snap.curves[String(t.index)] || []).length)
      .map((t) => {
        const points = snap.curves[String(t.index)];
        return { type: "scatter", mode: "lines+markers", name: label(t),
                 x: points.map((p) => p[0]), y: points.map((p) => p[1]) };
      });
    if (!traces.length) return charts.showEmpty("sweep-curves", "No trial has logged " + snap.metric + " yet.");
    const rungs = snap.rungs.map((step) => ({ type: "line", xref: "x", yref: "paper", x0: step, x1: step,
      y0: 0, y1: 1, line: { color: "#c4c9d4", dash: "dot", width: 1 } }));
    charts.draw("sweep-curves", traces, { xaxis: charts.axis("Step"), yaxis: charts.axis(snap.metric),
      showlegend: true, shapes: rungs, height: 320 });
  }

  /** A parcoords axis for one hyperparameter: numbers as they are, anything else by rank. */
  function dimension(name, values) {
    if (values.every((v) => typeof v === "number")) return { label: name, values: values };
    const levels = Array.from(new Set(values.map(String))).sort();
    return { label: name, values: values.map((v) => levels.indexOf(String(v))),
             tickvals: levels.map((_, i) => i), ticktext: levels };
  }

  function drawParcoords() {
    const done = snap.trials.filter((t) => t.metric !== null);
    if (!done.length) return charts.showEmpty("sweep-parcoords", "No trial has a result yet.");
    const names = Object.keys(done[0].params);
    const metric = done.map((t) => t.metric);
    const dims = names.map((name) => dimension(name, done.map((t) => t.params[name])));
    dims.push({ label: snap.metric, values: metric });
    const trace = { type: "parcoords", dimensions: dims,
      line: { color: metric, colorscale: "Viridis", reversescale: snap.mode === "min", showscale: true } };
    charts.draw("sweep-parcoords", [trace], { margin: { l: 60, r: 60, t: 40, b: 24 }, height: 320 });
  }

  drawCurves();
  drawParcoords();
  const state = document.getElementById("sweep-state");
  if (state && state.textContent === "running") setTimeout(() => window.location.reload(), 10000);
})();
