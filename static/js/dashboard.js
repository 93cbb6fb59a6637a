/* The tenant dashboard: the jobs table and tiles, kept live over the socket. */
(function () {
  "use strict";
  const { LiveSocket, fetchJSON, throttle, el, seconds } = window.PortalLive;
  const root = document.getElementById("live-dashboard");
  if (!root) return;
  const tenant = Number(root.dataset.tenant);
  const body = document.getElementById("jobs-body");
  const table = document.getElementById("jobs-table");
  const empty = document.getElementById("jobs-empty");

  function progressCell(row) {
    return el("td", { "data-field": "progress" }, row.step ? "step " + row.step : "—");
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
    tr.appendChild(el("td", {}, row.gpus + " (" + row.min_gpus + "–" + row.max_gpus + ")"));
    tr.appendChild(el("td", { "data-field": "parallelism" }, row.parallelism));
    tr.appendChild(progressCell(row));
    tr.appendChild(el("td", { "data-field": "throughput" }, row.throughput == null ? "—" : row.throughput.toFixed(0) + "/s"));
    tr.appendChild(el("td", { "data-field": "attained_gpu_seconds" }, seconds(row.attained_gpu_seconds)));
    tr.appendChild(el("td", { "data-field": "queue_position" }, row.queue_position == null ? "—" : "#" + row.queue_position));
    const when = el("td");
    when.appendChild(el("time", { datetime: row.submitted_at }, new Date(row.submitted_at).toLocaleString()));
    tr.appendChild(when);
    return tr;
  }

  function setTile(id, text) {
    const node = document.getElementById(id);
    if (node) node.textContent = text;
  }

  function applySnapshot(snap) {
    body.replaceChildren(...snap.jobs.map(renderRow));
    table.hidden = snap.jobs.length === 0;
    if (empty) empty.hidden = snap.jobs.length !== 0;
    const c = snap.counts;
    setTile("quota-use", snap.in_use + " / " + snap.quota);
    setTile("count-queued", c.queued + c.pending);
    setTile("count-running", c.running + c.scaling);
    setTile("count-completed", c.completed);
    setTile("jct-mean", seconds(snap.jct.mean));
    setTile("jct-p95", seconds(snap.jct.p95));
  }

  const resync = () => fetchJSON("/live/tenants/" + tenant + "/jobs.json").then(applySnapshot).catch(console.error);
  const resyncSoon = throttle(resync, 300);
  const resyncLater = throttle(resync, 1000);

  function onEvent(event) {
    if (event.tenant !== tenant || !event.job) return;
    const row = document.getElementById("job-" + event.job);
    if (!row) { resyncSoon(); return; }
    const stateChanged = row.dataset.state !== event.state;
    if (event.state) {
      row.dataset.state = event.state;
      const badge = row.querySelector('[data-field="state"]');
      badge.textContent = event.state;
      badge.className = "state state-" + event.state;
    }
    if (event.parallelism !== undefined) row.querySelector('[data-field="parallelism"]').textContent = event.parallelism;
    if (event.attained_gpu_seconds !== undefined) row.querySelector('[data-field="attained_gpu_seconds"]').textContent = seconds(event.attained_gpu_seconds);
    // steps, throughput, tiles and queue positions are not in the event: reload, coalesced
    if (stateChanged) resyncSoon(); else resyncLater();
  }

  new LiveSocket([{ topic: "tenant", id: tenant }], { onEvent, resync });
})();
