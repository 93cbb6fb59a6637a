/* The Usage pages: GPU-hours per day by user, per user, and the share of the cluster.
 * The figures come from the page's #usage-data (jobs.usage.chart_data); nothing is fetched. */
(function () {
  "use strict";
  const { axis, draw, showEmpty } = window.PortalCharts;
  const source = document.getElementById("usage-data");
  if (!source) return;
  const data = JSON.parse(source.textContent);
  const COLOURS = ["#2f6fed", "#e4572e", "#17a398", "#9b5de5", "#f3a712", "#d81159", "#5c677d", "#8ac926"];
  const hours = (s) => s / 3600;
  // Plain numbers, never "400µ".
  const hoursAxis = axis("GPU-hours", { rangemode: "tozero", tickformat: ",.3~r" });
  const empty = showEmpty;

  function byDay() {
    if (!data.by_day_user.length) return empty("usage-by-day", "No GPUs held in this range.");
    const users = [...new Set(data.by_day_user.map((r) => r.user))].sort();
    const traces = users.map((user, i) => {
      const rows = data.by_day_user.filter((r) => r.user === user);
      return { type: "bar", name: user, x: rows.map((r) => r.day), y: rows.map((r) => hours(r.gpu_seconds)), marker: { color: COLOURS[i % COLOURS.length] } };
    });
    draw("usage-by-day", traces, { barmode: "stack", showlegend: true, legend: { orientation: "h", y: -0.35 }, height: 320, margin: { l: 70, r: 16, t: 10, b: 90 }, xaxis: axis("Day (UTC)", { type: "category" }), yaxis: hoursAxis });
  }

  function byUser() {
    if (!data.by_user.length) return empty("usage-by-user", "No GPUs held in this range.");
    const rows = data.by_user.slice().sort((a, b) => b.gpu_seconds - a.gpu_seconds);
    draw("usage-by-user", [{ type: "bar", orientation: "h", x: rows.map((r) => hours(r.gpu_seconds)), y: rows.map((r) => r.user), marker: { color: COLOURS[0] } }], { height: Math.max(200, 40 + 28 * rows.length), margin: { l: 100, r: 16, t: 10, b: 48 }, xaxis: hoursAxis, yaxis: axis("User", { autorange: "reversed" }) });
  }

  function share() {
    const capacity = data.capacity_gpu_seconds;
    if (!capacity) return empty("usage-share", "No GPUs in the cluster yet.");
    // A tenant's page shows only its own slice; the rest of the cluster is one slice.
    const slices = data.by_tenant.map((r) => ({ name: r.tenant, value: r.gpu_seconds }));
    const used = slices.reduce((sum, s) => sum + s.value, 0);
    slices.push({ name: data.scope === "tenant" ? "rest of the cluster" : "not held", value: Math.max(0, capacity - used) });
    draw("usage-share", [{ type: "pie", hole: 0.45, sort: false, labels: slices.map((s) => s.name), values: slices.map((s) => hours(s.value)), marker: { colors: slices.map((_, i) => (i === slices.length - 1 ? "#d6dae1" : COLOURS[i % COLOURS.length])) }, textinfo: "label+percent", hovertemplate: "%{label}: %{value:.2f} GPU-hours<extra></extra>" }], { height: 300, showlegend: false, margin: { l: 10, r: 10, t: 10, b: 10 } });
  }

  byDay();
  byUser();
  share();
  window.__usageDrawn = true;
})();
