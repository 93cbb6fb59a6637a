/* The tenant dashboard: the jobs table and tiles, kept live over the socket. */
(function () {
  "use strict";
  /** "2 GPUs (range 1–4)"; a rigid job's range is its size, so only "2 GPUs". */
  const gpuRange = (row) => row.gpus + (row.gpus === 1 ? " GPU" : " GPUs") + (row.min_gpus === row.max_gpus ? "" : " (range " + row.min_gpus + "–" + row.max_gpus + ")");
  const { LiveSocket, fetchJSON, el, seconds, timeEl } = window.PortalLive;
  const root = document.getElementById("live-dashboard");
  if (!root) return;
  const tenant = Number(root.dataset.tenant);
  const body = document.getElementById("jobs-body");
  const table = document.getElementById("jobs-table");
  const empty = document.getElementById("jobs-empty");

  function progressCell(row) {
    return el("td", { "data-field": "progress" }, row.step ? "step " + row.step : "—");
  }

  /** Estimates and submission times read best as distances ("in 12 min", "3 min ago"). */
  const timeNode = (iso) => timeEl(iso, true);

  /** The predicted start (queued) and finish (queued, running); the reason when missing. */
  function estimateCell(row) {
    const td = el("td", { "data-field": "estimate" });
    if (row.estimate_reason) td.title = row.estimate_reason;
    if (row.state === "queued" && row.estimated_start) {
      td.append("start ", timeNode(row.estimated_start));
      if (row.estimated_finish) td.append(" · end ", timeNode(row.estimated_finish));
    } else if (row.estimated_finish) {
      td.append("end ", timeNode(row.estimated_finish));
    } else {
      td.textContent = "—";
    }
    return td;
  }

  function renderRow(row) {
    const tr = el("tr", { id: "job-" + row.id, "data-job": row.id, "data-state": row.state });
    const idCell = el("td");
    idCell.appendChild(el("a", { href: row.url }, row.id));
    tr.appendChild(idCell);
    tr.appendChild(el("td", {}, row.name));
    tr.appendChild(el("td", {}, row.workload));
    const stateCell = el("td");
    stateCell.appendChild(el("span", { class: "state state-" + row.state, "data-field": "state" }, row.state));
    tr.appendChild(stateCell);
    tr.appendChild(el("td", {}, gpuRange(row)));
    tr.appendChild(el("td", { "data-field": "parallelism" }, row.parallelism));
    tr.appendChild(progressCell(row));
    tr.appendChild(el("td", { "data-field": "throughput" }, row.throughput == null ? "—" : row.throughput.toFixed(0) + "/s"));
    tr.appendChild(el("td", { "data-field": "attained_gpu_seconds" }, seconds(row.attained_gpu_seconds)));
    tr.appendChild(el("td", { "data-field": "queue_position" }, row.queue_position == null ? "—" : "#" + row.queue_position));
    tr.appendChild(estimateCell(row));
    const when = el("td");
    when.appendChild(timeNode(row.submitted_at));
    tr.appendChild(when);
    return tr;
  }

  function setTile(id, text) {
    const node = document.getElementById(id);
    if (node) node.textContent = text;
  }

  let counts = null;  // state -> number of the tenant's jobs, from the snapshot or tenant.counts

  function showCounts() {
    setTile("count-queued", counts.queued + counts.pending);
    setTile("count-running", counts.running + counts.scaling);
    setTile("count-completed", counts.completed);
  }

  function showJct(jct) {
    setTile("jct-mean", seconds(jct.mean));
    setTile("jct-p95", seconds(jct.p95));
  }

  let quota = Number((document.getElementById("quota-use").textContent.split("/")[1] || "0").trim());

  function applySnapshot(snap) {
    body.replaceChildren(...snap.jobs.map(renderRow));
    table.hidden = snap.jobs.length === 0;
    if (empty) empty.hidden = snap.jobs.length !== 0;
    counts = Object.assign({}, snap.counts);
    quota = snap.quota;
    setTile("quota-use", snap.in_use + " / " + snap.quota);
    showCounts();
    showJct(snap.jct);
  }

  const ROW_LIMIT = 200;  // the snapshot's newest jobs (jobs/live/snapshots.py)
  const showPosition = (tr, position) => {
    tr.querySelector('[data-field="queue_position"]').textContent = position == null ? "—" : "#" + position;
  };

  // The snapshot is loaded on open, on every reconnect and after a lost batch (live.js);
  // it resolves to the snapshot so that live.js learns the seq it reflects.  Everything
  // else is patched from the events: a job's row from its events, counts and GPUs in use
  // from tenant.counts, positions from tenant.queue and forecast.updated, JCT from tenant.jct.
  const resync = () => fetchJSON("/live/tenants/" + tenant + "/jobs.json").then((snap) => { applySnapshot(snap); return snap; });

  /** A forecast refresh: patch the changed jobs' positions and estimates in place. */
  function onForecast(event) {
    for (const entry of event.jobs || []) {
      const row = document.getElementById("job-" + entry.job);
      if (!row) continue;
      showPosition(row, entry.queue_position);
      const shown = Object.assign({ state: row.dataset.state }, entry);
      row.replaceChild(estimateCell(shown), row.querySelector('[data-field="estimate"]'));
    }
  }

  /** The queue moved: every queued job of the tenant with its position (absent: none yet). */
  function onQueue(event) {
    const positions = event.positions || {};
    const complete = Object.keys(positions).length < ROW_LIMIT;
    for (const tr of body.querySelectorAll("tr")) {
      const position = positions[tr.dataset.job];
      if (tr.dataset.state !== "queued") showPosition(tr, null);
      else if (position !== undefined || complete) showPosition(tr, position);
    }
  }

  /** A job this page has not listed yet: a new one, whose event carries its row. */
  function addRow(event) {
    const row = Object.assign({ id: event.job, state: event.state, parallelism: event.parallelism, step: event.step, throughput: event.samples_per_s, attained_gpu_seconds: event.attained_gpu_seconds, queue_position: null }, event.row);
    body.prepend(renderRow(row));
    while (body.children.length > ROW_LIMIT) body.lastElementChild.remove();
    table.hidden = false;
    if (empty) empty.hidden = true;
  }

  function onEvent(event) {
    if (event.tenant !== tenant) return;
    if (event.type === "forecast.updated") { onForecast(event); return; }
    if (event.type === "tenant.counts") {
      counts = Object.assign({}, event.counts);
      showCounts();
      setTile("quota-use", event.in_use + " / " + quota);
      return;
    }
    if (event.type === "tenant.queue") { onQueue(event); return; }
    if (event.type === "tenant.jct") { showJct(event.jct); return; }
    if (!event.job) return;
    const row = document.getElementById("job-" + event.job);
    if (!row) {
      if (event.row) addRow(event);  // older jobs beyond the newest 200 are not listed
      return;
    }
    if (event.state !== undefined && row.dataset.state !== event.state) {
      row.dataset.state = event.state;
      const badge = row.querySelector('[data-field="state"]');
      badge.textContent = event.state;
      badge.className = "state state-" + event.state;
      if (event.state !== "queued") showPosition(row, null);
    }
    if (event.parallelism !== undefined) row.querySelector('[data-field="parallelism"]').textContent = event.parallelism;
    if (event.attained_gpu_seconds !== undefined) row.querySelector('[data-field="attained_gpu_seconds"]').textContent = seconds(event.attained_gpu_seconds);
    if (event.step !== undefined) row.replaceChild(progressCell(event), row.querySelector('[data-field="progress"]'));
    if (event.samples_per_s !== undefined && event.samples_per_s !== null) row.querySelector('[data-field="throughput"]').textContent = event.samples_per_s.toFixed(0) + "/s";
  }

  new LiveSocket([{ topic: "tenant", id: tenant }], { onEvent, resync });
})();
