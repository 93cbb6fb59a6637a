/* The job page: state, counters, charts, artifacts and history, kept live (socket and polling).
 * It patches itself from the job's events; a snapshot is loaded only on open, reconnect or a gap. */
(function () {
  "use strict";
  const { LiveSocket, fetchJSON, throttle, el, seconds, when, timeEl } = window.PortalLive;
  const { maxOf, minOf, axis, countAxis, timeAxis, draw, showEmpty } = window.PortalCharts;
  const root = document.getElementById("live-job");
  if (!root) return;
  const jobId = Number(root.dataset.job);
  const TERMINAL = ["completed", "failed", "cancelled"];
  const isOver = () => TERMINAL.includes(root.dataset.state || "");

  /** One time span for both job charts: from the first event or sample to now (or the end). */
  function runSpan(parallelism, throughput) {
    const times = (parallelism.t || []).concat((throughput && throughput.t) || []).map((t) => Date.parse(t)).filter((t) => !Number.isNaN(t));
    if (!times.length) return null;
    const end = isOver() ? maxOf(times) : Math.max(Date.now(), maxOf(times));
    const start = minOf(times);
    return [new Date(start).toISOString(), new Date(Math.max(end, start + 1000)).toISOString()];
  }

  function drawParallelism(series, span) {
    if (!series.t.length) { showEmpty("chart-parallelism", "Not started yet: the chart begins when the job first gets GPUs."); return; }
    const x = series.t.slice();
    const y = series.gpus.slice();
    if (!isOver()) { x.push(new Date().toISOString()); y.push(y[y.length - 1]); }
    draw("chart-parallelism", [{ x: x, y: y, type: "scatter", mode: "lines", line: { shape: "hv", color: "#2f6fed", width: 2 }, fill: "tozeroy", fillcolor: "rgba(47,111,237,.12)", name: "GPUs", hovertemplate: "%{y} GPUs<extra></extra>" }],
      { xaxis: timeAxis(span), yaxis: countAxis("GPUs", maxOf(y, 1)) });
  }

  /** Dotted vertical lines where the job's parallelism changed (after it first started). */
  function parallelismMarks(series) {
    const marks = [];
    for (let i = 1; i < series.t.length; i++) {
      if (series.gpus[i] === series.gpus[i - 1]) continue;
      marks.push({ type: "line", xref: "x", yref: "paper", x0: series.t[i], x1: series.t[i], y0: 0, y1: 1, line: { color: "#2f6fed", width: 1, dash: "dot" } });
    }
    return marks;
  }

  function drawThroughput(series, parallelism, span) {
    if (!series || !series.t || !series.t.length) return;
    const shapes = parallelismMarks(parallelism);
    draw("chart-throughput", [{ x: series.t, y: series.samples_per_second, type: "scatter", mode: "lines", line: { color: "#1e8e3e" }, name: "samples/s", customdata: series.step, hovertemplate: "%{y:.0f} samples/s<br>step %{customdata}<extra></extra>" }],
      { xaxis: timeAxis(span), yaxis: axis("Throughput (samples/s)", { rangemode: "tozero", tickformat: "~s" }), shapes: shapes });
  }

  function drawProfile(profile) {
    if (!profile || !profile.gpus || !profile.gpus.length) return;
    draw("chart-profile", [{ x: profile.gpus, y: profile.samples_per_second, type: "scatter", mode: "lines+markers", line: { color: "#b7791f" }, name: "profiled", hovertemplate: "%{x} GPUs: %{y:.0f} samples/s<extra></extra>" }],
      { xaxis: countAxis("GPUs", maxOf(profile.gpus, 1), { rangemode: "normal" }), yaxis: axis("Throughput (samples/s)", { rangemode: "tozero", tickformat: "~s" }) });
  }

  // Loss (from the progress samples) and the metrics the program logs, by step, and the
  // objects the job stored: read from the API on open and every few seconds while the job
  // runs (no socket event carries them), once more a little after it ends (its log export).
  const OUTPUTS_POLL_MS = 5000;
  const AFTER_END_MS = 20000;
  const PALETTE = ["#2f6fed", "#c5221f", "#1e8e3e", "#b7791f", "#8e44ad", "#00838f", "#5f6368", "#d81b60"];

  function drawLoss(progress) {
    const points = (progress || []).filter((p) => p.loss !== null && p.loss !== undefined);
    if (!points.length) return;
    const steps = points.map((p) => p.step);
    draw("chart-loss", [{ x: steps, y: points.map((p) => p.loss), type: "scatter", mode: "lines", line: { color: "#c5221f" }, name: "loss", hovertemplate: "loss %{y:.4g}<br>step %{x}<extra></extra>" }],
      { xaxis: countAxis("Step", maxOf(steps, 1), { rangemode: "normal" }), yaxis: axis("Loss") });
  }

  function drawMetrics(metrics) {
    const names = Object.keys(metrics || {}).sort();
    if (!names.length) return;
    const traces = names.map((name, i) => ({
      x: metrics[name].map((p) => p[0]), y: metrics[name].map((p) => p[1]), type: "scatter", mode: "lines",
      name: name, line: { color: PALETTE[i % PALETTE.length] }, hovertemplate: name + " %{y:.4g}<br>step %{x}<extra></extra>",
    }));
    const lastStep = maxOf(traces.map((t) => maxOf(t.x, 1)), 1);
    draw("chart-metrics", traces, { showlegend: true, legend: { orientation: "h", y: -0.3 }, margin: { l: 56, r: 16, t: 10, b: 80 }, xaxis: countAxis("Step", lastStep, { rangemode: "normal" }), yaxis: axis(names.length === 1 ? names[0] : "Value (as logged)") });
  }

  function fileSize(bytes) {
    const units = ["bytes", "KB", "MB", "GB", "TB"];
    let value = bytes, unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
    return unit ? value.toFixed(1) + " " + units[unit] : value + " bytes";
  }

  const KIND_LABELS = { checkpoint: "Checkpoint", final: "Final checkpoint", user: "Artifact", log: "Log" };
  const signatureOf = (pairs) => pairs.map((p) => p.join(":")).sort().join(",");
  // The rows the page opened with count as drawn: a poll that finds the same ones keeps them.
  let artifactsSeen = signatureOf([...document.querySelectorAll("#artifacts-body tr")].map((tr) => [tr.dataset.artifact, tr.dataset.sha]));
  function drawArtifacts(rows) {
    const signature = signatureOf(rows.map((a) => [String(a.id), a.sha256]));
    if (signature === artifactsSeen) return;
    artifactsSeen = signature;
    const ordered = rows.slice().sort((a, b) => (a.kind === "final" ? 0 : 1) - (b.kind === "final" ? 0 : 1));
    document.getElementById("artifacts-body").replaceChildren(...ordered.map((a) => {
      const final = a.kind === "final";
      const tr = el("tr", { dataset: { artifact: String(a.id), kind: a.kind, sha: a.sha256 } });
      if (final) tr.className = "artifact-final";
      const kind = el("td");
      kind.appendChild(final ? el("span", { class: "state state-completed" }, "final") : document.createTextNode(KIND_LABELS[a.kind] || a.kind));
      tr.appendChild(kind);
      const name = el("td");
      name.appendChild(final ? el("strong", {}, a.name) : document.createTextNode(a.name));
      tr.appendChild(name);
      tr.appendChild(el("td", {}, a.step === null ? "—" : a.step));
      tr.appendChild(el("td", { title: a.size + " bytes" }, fileSize(a.size)));
      const sha = el("td");
      sha.appendChild(el("code", { title: a.sha256 }, a.sha256.slice(0, 12)));
      tr.appendChild(sha);
      const link = el("a", { class: "button secondary artifact-download", style: "margin-top:0", href: "/api/v1/jobs/" + jobId + "/artifacts/" + a.id + "/download/", download: a.path.split("/").pop() }, "Download");
      const cell = el("td");
      cell.appendChild(link);
      tr.appendChild(cell);
      return tr;
    }));
    document.getElementById("artifacts-table").hidden = !rows.length;
    document.getElementById("artifacts-empty").hidden = rows.length > 0;
  }

  function loadOutputs() {
    return Promise.all([
      fetchJSON("/api/v1/jobs/" + jobId + "/metrics/").then((m) => { drawLoss(m.progress); drawMetrics(m.metrics); }),
      fetchJSON("/api/v1/jobs/" + jobId + "/artifacts/?page_size=200").then((page) => drawArtifacts(page.results)),
    ]);
  }

  let sawRunning = false;
  function pollOutputs() {
    loadOutputs().catch(console.error).finally(() => {
      if (!isOver()) { sawRunning = true; setTimeout(pollOutputs, OUTPUTS_POLL_MS); }
      else if (sawRunning) { sawRunning = false; setTimeout(pollOutputs, AFTER_END_MS); }
    });
  }

  // The job's whole output: the page opens with its last lines, job.log events append
  // the new ones, a reconnect reads what was missed (since the last cursor).  Lines are
  // text nodes, never HTML.
  const logPre = document.getElementById("job-log");
  const logSelect = document.getElementById("job-log-worker");
  const LOG_KEEP_CHARS = 4000000;
  let logCursor = document.getElementById("job-log-card").dataset.cursor || "";

  function cursorAfter(a, b) {
    if (!b) return true;
    const x = a.split("-").map(Number), y = b.split("-").map(Number);
    return x[0] > y[0] || (x[0] === y[0] && x[1] > y[1]);
  }

  function addWorkerOption(worker) {
    if (!worker || [...logSelect.options].some((o) => o.value === worker)) return;
    const option = el("option", {}, worker);
    option.value = worker;
    logSelect.appendChild(option);
  }

  function appendLog(lines) {
    const wanted = logSelect.value;
    const fresh = lines.filter((l) => cursorAfter(l.cursor, logCursor));
    if (!fresh.length) return;
    logCursor = fresh[fresh.length - 1].cursor;
    fresh.forEach((l) => addWorkerOption(l.worker));
    const shown = fresh.filter((l) => !wanted || !l.worker || l.worker === wanted);
    if (!shown.length) return;
    const atBottom = logPre.scrollTop + logPre.clientHeight >= logPre.scrollHeight - 4;
    logPre.appendChild(document.createTextNode(shown.map((l) => (l.worker ? "[" + l.worker + "] " : "") + l.text + "\n").join("")));
    if (logPre.textContent.length > LOG_KEEP_CHARS) {
      const text = logPre.textContent;
      const from = text.indexOf("\n", text.length - LOG_KEEP_CHARS / 2) + 1;
      logPre.textContent = text.slice(from);
    }
    logPre.hidden = false;
    document.getElementById("job-log-empty").hidden = true;
    if (atBottom) logPre.scrollTop = logPre.scrollHeight;
  }

  function loadLog(replace) {
    const worker = logSelect.value ? "&worker=" + encodeURIComponent(logSelect.value) : "";
    const query = replace ? "tail=1000" : "tail=10000&since=" + encodeURIComponent(logCursor || "0-0");
    return fetchJSON("/api/v1/jobs/" + jobId + "/logs/?" + query + worker).then((page) => {
      if (replace) { logPre.textContent = ""; logCursor = ""; }
      appendLog(page.lines);
      if (!page.lines.length && !logCursor) logCursor = page.cursor;
    });
  }
  logSelect.addEventListener("change", () => loadLog(true).catch(console.error));
  if (!logPre.hidden) logPre.scrollTop = logPre.scrollHeight;

  function drawEvents(events) {
    const body = document.getElementById("events-body");
    body.replaceChildren(...events.map((e) => {
      const tr = el("tr");
      tr.appendChild(el("td", {}, when(e.at)));
      tr.appendChild(el("td", {}, e.label));
      tr.appendChild(el("td", {}, e.from_state || e.to_state ? (e.from_state || "·") + " → " + e.to_state : ""));
      tr.appendChild(el("td", {}, e.to_parallelism !== null ? (e.from_parallelism === null ? "·" : e.from_parallelism) + " → " + e.to_parallelism : ""));
      tr.appendChild(el("td", {}, e.reason));
      return tr;
    }));
  }

  function setState(state) {
    root.dataset.state = state;
    const badge = document.getElementById("job-state");
    badge.textContent = state;
    badge.className = "state state-" + state;
    if (["completed", "failed", "cancelled"].includes(state)) {
      const cancel = document.getElementById("cancel-form");
      if (cancel) cancel.hidden = true;
    }
  }

  /** The predicted start (while queued) and finish tiles, and why one is missing. */
  function showEstimates(est, state) {
    const put = (id, iso) => {
      const node = document.getElementById(id);
      if (iso) node.replaceChildren(timeEl(iso, false));
      else node.textContent = "—";
    };
    put("job-estimated-start", state === "queued" ? est.estimated_start : null);
    put("job-estimated-finish", est.estimated_finish);
    document.getElementById("job-estimate-reason").textContent = est.estimate_reason || "";
  }

  function rangeText(snap) {
    if (snap.min_gpus === snap.max_gpus) return snap.gpus + (snap.gpus === 1 ? " GPU" : " GPUs") + ", fixed";
    return snap.min_gpus + "–" + snap.max_gpus + " GPUs (asked " + snap.gpus + ")";
  }

  function restartsText(snap) {
    if (!snap.max_restarts) return "none: a failed program ends the job";
    return snap.restarts + " of " + snap.max_restarts + " used (a failed program is requeued from its latest checkpoint)";
  }

  /** The Settings card's parts that change while the job runs, and its Progress tile. */
  function showSettings(snap) {
    const put = (id, text) => { const node = document.getElementById(id); if (node) node.textContent = text; };
    put("job-started", snap.started_at ? when(snap.started_at) : "—");
    put("job-finished", snap.finished_at ? when(snap.finished_at) : "—");
    put("job-range", rangeText(snap));
    put("job-range-tile", rangeText(snap));
    put("job-restarts", restartsText(snap));
    put("job-step", snap.step ? "step " + snap.step : "—");
    put("job-wait-reason", snap.wait_reason || "");
    const wait = document.getElementById("job-wait");
    if (wait) wait.hidden = !snap.wait_reason || !["pending", "queued"].includes(snap.state);
    if (wait && !wait.hidden) document.getElementById("job-workflow").hidden = false;
  }

  // The "Job N submitted." note describes the page as it opened; once a live event
  // has changed the job, it is stale and goes.
  let updatedLive = false;
  function dropFlash() {
    if (updatedLive) return;
    updatedLive = true;
    document.querySelectorAll(".messages li.success").forEach((li) => li.remove());
    document.querySelectorAll(".messages").forEach((ul) => { if (!ul.children.length) ul.remove(); });
  }

  function apply(snap) {
    setState(snap.state);
    showSettings(snap);
    document.getElementById("job-parallelism").textContent = snap.parallelism;
    document.getElementById("job-gpu-time").textContent = seconds(snap.attained_gpu_seconds);
    document.getElementById("job-queue").textContent = snap.queue_position ? "#" + snap.queue_position : "—";
    showEstimates(snap, snap.state);
    document.getElementById("job-jct").textContent = seconds(snap.jct_seconds);
    const span = runSpan(snap.parallelism_series, snap.throughput_series);
    drawParallelism(snap.parallelism_series, span);
    drawThroughput(snap.throughput_series, snap.parallelism_series, span);
    drawProfile(snap.profile);
    drawEvents(snap.events);
    // The page's other parts follow the model too (terminal.js: the job's workers).
    root.dispatchEvent(new CustomEvent("portal:job", { detail: snap }));
  }

  // The page's model: the snapshot it opened with (or reloaded), patched by every event.
  // Events carry what the page shows (jobs.live.patches): the job's fields, each new
  // history row (job.event) and progress sample (job.sample); the page redraws from the
  // model and reloads the snapshot only on a seq gap or a reconnect (live.js).
  let current = JSON.parse(document.getElementById("job-snapshot").textContent);
  const render = throttle(() => apply(current), 60);
  const PAGE_FIELDS = ["state", "parallelism", "attained_gpu_seconds", "started_at", "finished_at", "gpus", "min_gpus", "max_gpus", "restarts", "max_restarts", "jct_seconds", "profile", "wait_reason", "workers"];

  function patchJob(event) {
    for (const field of PAGE_FIELDS) if (event[field] !== undefined) current[field] = event[field];
    if (event.samples_per_s !== undefined && event.samples_per_s !== null) current.throughput = event.samples_per_s;
    if (event.step !== undefined) {
      // A completed job shows the furthest step known (its final checkpoint may be past the last report).
      current.step = TERMINAL.includes(current.state) ? Math.max(current.step || 0, event.step) : event.step;
    }
    if (current.state !== "queued") current.queue_position = null;
    if (!["queued", "running", "scaling"].includes(current.state)) Object.assign(current, { estimated_start: null, estimated_finish: null, estimate_reason: "" });
  }

  /** A new row of the job's history; a change of parallelism is also a step of its chart. */
  function patchHistory(row) {
    current.events.push(row);
    if (row.to_parallelism !== null && row.to_parallelism !== undefined) {
      current.parallelism_series.t.push(row.at);
      current.parallelism_series.gpus.push(row.to_parallelism);
    }
  }

  const METRIC_LIMIT = 2000;  // the snapshot's newest samples (jobs/live/snapshots.py)
  function patchSample(sample) {
    const series = current.throughput_series;
    series.t.push(sample.at);
    series.samples_per_second.push(sample.samples_per_s);
    series.parallelism.push(sample.parallelism);
    series.step.push(sample.step);
    if (series.t.length > METRIC_LIMIT) for (const key of ["t", "samples_per_second", "parallelism", "step"]) series[key].splice(0, series.t.length - METRIC_LIMIT);
  }

  // It resolves to the snapshot, so that live.js learns the seq it reflects.
  const resync = () => fetchJSON("/live/jobs/" + jobId + ".json").then((snap) => { current = snap; apply(snap); return snap; });

  function onEvent(event) {
    if (event.job !== jobId) return;
    if (event.type === "forecast.updated") {
      const est = (event.jobs || [])[0];
      if (!est) return;
      Object.assign(current, { queue_position: est.queue_position, estimated_start: est.estimated_start, estimated_finish: est.estimated_finish, estimate_reason: est.estimate_reason });
      render();
      return;
    }
    if (event.type === "job.log") {
      if (event.lines) appendLog(event.lines);
      return;
    }
    dropFlash();
    if (event.type === "job.event") patchHistory(event.event);
    else if (event.type === "job.sample") patchSample(event.sample);
    else patchJob(event);
    render();
  }

  apply(current);
  pollOutputs();
  const resyncAll = () => { loadLog(false).catch(console.error); return resync(); };
  new LiveSocket([{ topic: "job", id: jobId }], { onEvent, resync: resyncAll });
})();
