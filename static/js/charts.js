/* The one chart helper: every chart's layout, axes with titles and units, tick formats, CDFs.
 *
 *   page script ──> PortalCharts.draw(node, traces, { xaxis: axis("Time (UTC)"), yaxis: countAxis("GPUs", 4) })
 *                       └─> layout(): the shared look, then Plotly.react
 *
 * plotly.js 4 reads an axis title only in its object form ({ title: { text } }); the
 * string form is ignored without a word, so every title is made here, never by hand.
 * Loaded by base.html on every page (it is small and touches Plotly only when called). */
(function () {
  "use strict";
  const GRID = "#e3e6eb";
  const CONFIG = { displayModeBar: false, responsive: true };

  /** An axis titled ``title`` (with its unit, e.g. "JCT (min)"); ``extra`` overrides. */
  function axis(title, extra) {
    return Object.assign({ title: { text: title }, gridcolor: GRID, automargin: true, zeroline: false }, extra || {});
  }

  /** The largest and smallest of ``values`` (numbers), ``fallback`` when there are none.
   * A loop, not Math.max(...values): a long run's series overflows the argument list. */
  function maxOf(values, fallback) {
    let best = -Infinity;
    for (const v of values) if (v !== null && v !== undefined && v > best) best = v;
    return best === -Infinity ? fallback : best;
  }
  function minOf(values, fallback) {
    let best = Infinity;
    for (const v of values) if (v !== null && v !== undefined && v < best) best = v;
    return best === Infinity ? fallback : best;
  }

  /** A step of 1, 2 or 5 × 10^k giving about six ticks up to ``max``, never below 1. */
  function integerStep(max) {
    const rough = Math.max(1, Number(max) || 1) / 6;
    const power = Math.pow(10, Math.floor(Math.log10(rough)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough);
    return Math.max(1, Math.round(step));
  }

  /** An axis of counts (GPUs, jobs): whole-number ticks from 0, up to at least ``max``. */
  function countAxis(title, max, extra) {
    return axis(title, Object.assign({ rangemode: "tozero", tickformat: "d", tick0: 0, dtick: integerStep(max) }, extra || {}));
  }

  /** An axis of fractions shown as percentages, 0-100 %. */
  function percentAxis(title, extra) {
    return axis(title, Object.assign({ range: [0, 1.04], tickformat: ".0%", tickmode: "linear", tick0: 0, dtick: 0.25 }, extra || {}));
  }

  /** A time axis; ``range`` ([start, end], ISO strings) lets charts share one span. */
  function timeAxis(range, extra) {
    const base = { type: "date" };
    if (range && range[0] && range[1]) base.range = range;
    return axis("Time (UTC)", Object.assign(base, extra || {}));
  }

  /** Seconds, minutes or hours, whichever reads best for durations up to ``maxSeconds``. */
  function durationUnit(maxSeconds) {
    if (!(maxSeconds >= 120)) return { unit: "s", seconds: 1 };
    if (maxSeconds < 7200) return { unit: "min", seconds: 60 };
    return { unit: "h", seconds: 3600 };
  }

  /** An empirical CDF of sorted ``values`` that starts at (x0, 0): one step per job. */
  function cdf(values, scale) {
    const divide = scale || 1;
    if (!values.length) return { x: [], y: [] };
    const x = [values[0] / divide].concat(values.map((v) => v / divide));
    const y = [0].concat(values.map((_, i) => (i + 1) / values.length));
    return { x: x, y: y };
  }

  /** A note in the middle of a chart (e.g. "One job so far"), kept in the layout. */
  function note(text) {
    return { text: text, xref: "paper", yref: "paper", x: 0.5, y: 0.98, yanchor: "top", showarrow: false, font: { size: 12, color: "#667085" }, bgcolor: "rgba(255,255,255,.8)" };
  }

  /** The shared look: compact, transparent, the portal's font; ``extra`` overrides. */
  function layout(extra) {
    return Object.assign({
      margin: { l: 56, r: 16, t: 10, b: 48 },
      height: 260,
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 12, color: "#1d2330" },
      showlegend: false,
    }, extra || {});
  }

  /** Draw (or redraw in place) ``traces`` into ``node`` with the shared layout. */
  function draw(node, traces, extra) {
    const target = typeof node === "string" ? document.getElementById(node) : node;
    const empty = target.querySelector(":scope > .chart-empty");
    if (empty) empty.remove();
    return Plotly.react(target, traces, layout(extra), CONFIG);
  }

  /** Replace a chart with one line saying why it is empty. */
  function showEmpty(node, text) {
    const target = typeof node === "string" ? document.getElementById(node) : node;
    if (window.Plotly && target.classList.contains("js-plotly-plot")) Plotly.purge(target);
    const line = document.createElement("p");
    line.className = "chart-empty";
    line.textContent = text;
    target.replaceChildren(line);
  }

  window.PortalCharts = { maxOf, minOf, axis, countAxis, percentAxis, timeAxis, durationUnit, cdf, note, layout, draw, showEmpty, integerStep };
})();
