/* The tenant dashboard: the jobs table and tiles, kept live over the socket. */
(function () {
  "use strict";
  /** "2 GPUs (range 1–4)"; a rigid job's range is its size, so only "2 GPUs". */
  const gpuRange = (row) => row.gpus + (row.gpus === 1 ? " GPU" : " GPUs") + (row.min_gpus === row.max_gpus ? "" : " (range " + row.min_gpus + "–" + row.max_gpus + ")");
  const { LiveSocket, fetchJSON, throttle, el, seconds, timeEl } = window.PortalLive;
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

  let counts = null;  // state -> number of the tenant's jobs, from the last snapshot

  function showCounts() {
    setTile("count-queued", counts.queued + counts.pending);
    setTile("count-running", counts.running + counts.scaling);
    setTile("count-completed", counts.completed);
  }

  function applySnapshot(snap) {
    body.replaceChildren(...snap.jobs.map(renderRow));
    table.hidden = snap.jobs.length === 0;
    if (empty) empty.hidden = snap.jobs.length !== 0;
    counts = Object.assign({}, snap.counts);
    setTile("quota-use", snap.in_use + " / " + snap.quota);
    showCounts();
    setTile("jct-mean", seconds(snap.jct.mean));
    setTile("jct-p95", seconds(snap.jct.p95));
  }

  let quota = Number((document.getElementById("quota-use").textContent.split("/")[1] || "0").trim());

  /** GPUs in use from the rows on the page (active jobs are recent, so they are listed). */
  function recountInUse() {
    let used = 0;
    for (const tr of body.querySelectorAll("tr")) {
      if (tr.dataset.state === "running" || tr.dataset.state === "scaling") used += Number(tr.querySelector('[data-field="parallelism"]').textContent) || 0;
    }
    setTile("quota-use", used + " / " + quota);
  }

  const resync = () => fetchJSON("/live/tenants/" + tenant + "/jobs.json").then((snap) => { quota = snap.quota; applySnapshot(snap); }).catch(console.error);
  // A state change moves counts and queue positions: reload soon. Progress without its
  // figures in the event: reload now and then. Parallelism and GPU-time: patched here.
  // Reload (coalesced, jittered so that many pages do not ask at once) only for what the
  // event cannot tell: queue positions (a job entered or left the queue), JCT (a job
  // completed), a row this page has not seen, progress figures the event does not carry.
  // State counts, parallelism, GPUs in use and GPU-time are patched from the event.
  const resyncSoon = throttle(resync, 300, 700);
  const resyncSlow = throttle(resync, 5000, 2000);

  /** A forecast refresh: patch the changed jobs' positions and estimates in place. */
  function onForecast(event) {
    for (const entry of event.jobs || []) {
      const row = document.getElementById("job-" + entry.job);
      if (!row) continue;
      row.querySelector('[data-field="queue_position"]').textContent = entry.queue_position == null ? "—" : "#" + entry.queue_position;
      const shown = Object.assign({ state: row.dataset.state }, entry);
      row.replaceChild(estimateCell(shown), row.querySelector('[data-field="estimate"]'));
    }
  }

  function onEvent(event) {
    if (event.type === "forecast.updated") {
      if (event.tenant === tenant) onForecast(event);
      return;
    }
    if (event.tenant !== tenant || !event.job) return;
    const row = document.getElementById("job-" + event.job);
    if (!row) { resyncSoon(); return; }
    const before = row.dataset.state;
    const stateChanged = event.state !== undefined && before !== event.state;
    if (stateChanged) {
      row.dataset.state = event.state;
      const badge = row.querySelector('[data-field="state"]');
      badge.textContent = event.state;
      badge.className = "state state-" + event.state;
      if (counts && before in counts && event.state in counts) {
        counts[before] -= 1;
        counts[event.state] += 1;
        showCounts();
      }
    }
    if (event.parallelism !== undefined) row.querySelector('[data-field="parallelism"]').textContent = event.parallelism;
    if (event.attained_gpu_seconds !== undefined) row.querySelector('[data-field="attained_gpu_seconds"]').textContent = seconds(event.attained_gpu_seconds);
    if (event.step !== undefined) row.replaceChild(progressCell(event), row.querySelector('[data-field="progress"]'));
    if (event.samples_per_s !== undefined && event.samples_per_s !== null) row.querySelector('[data-field="throughput"]').textContent = event.samples_per_s.toFixed(0) + "/s";
    recountInUse();
    const queueMoved = stateChanged && (before === "queued" || event.state === "queued" || before === "pending");
    if (queueMoved || (stateChanged && event.state === "completed") || !counts) resyncSoon();
    else if (event.type === "job.progress" && event.step === undefined) resyncSlow();
  }

  new LiveSocket([{ topic: "tenant", id: tenant }], { onEvent, resync });
})();
