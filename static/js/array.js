/* The array page, kept live: counts per state, the task table, Cancel all / Retry failed.
 *
 * It listens on its tenant's topic (live.js), where every change of a job is an event
 * (job.updated, job.created, ...; jobs.lifecycle.broadcast).  An event of one of its
 * tasks patches that task's state at once and recounts; then, throttled, the page reloads
 * the array (GET /api/v1/arrays/<id>/) for what events do not carry: each task's
 * wait_reason, and tasks that a retry added.  The same reload is live.js's resync (on
 * open, reconnect and a gap).  No timer polls: nothing reloads while no task changes.
 */
(function () {
  "use strict";
  const { LiveSocket, fetchJSON, throttle, el } = window.PortalLive;
  const root = document.getElementById("array");
  if (!root) return;
  const arrayId = Number(root.dataset.array);
  const tenantId = Number(root.dataset.tenant);
  const TERMINAL = ["completed", "failed", "cancelled"];

  let current = JSON.parse(document.getElementById("array-snapshot").textContent);

  /** Each state's number of tasks (latest attempts), as the server counts them. */
  function countsOf(tasks) {
    const counts = {};
    for (const task of tasks) counts[task.state] = (counts[task.state] || 0) + 1;
    return counts;
  }

  function drawCounts(counts) {
    const tiles = document.getElementById("array-tiles");
    tiles.querySelectorAll(".count-tile").forEach((tile) => tile.remove());
    for (const state of Object.keys(counts).sort()) {
      const tile = el("div", { class: "tile count-tile" });
      tile.append(el("span", { class: "k" }, state.charAt(0).toUpperCase() + state.slice(1)));
      tile.append(el("span", { class: "v", id: "array-count-" + state }, counts[state]));
      tiles.append(tile);
    }
  }

  function drawTasks(tasks) {
    const body = document.getElementById("array-tasks-body");
    body.replaceChildren(...tasks.map((task) => {
      const row = el("tr", { dataset: { task: String(task.task_id), job: String(task.job) } });
      const link = el("a", { href: "/jobs/" + task.job + "/" }, "job " + task.job);
      const state = el("span", { class: "state state-" + task.state }, task.state);
      row.append(el("td", {}, task.task_id), el("td"), el("td"), el("td", {}, task.wait_reason || ""));
      row.children[1].append(link);
      row.children[2].append(state);
      return row;
    }));
  }

  function drawButtons(counts) {
    const cancel = document.getElementById("array-cancel-form");
    const retry = document.getElementById("array-retry-form");
    if (cancel) cancel.hidden = Object.keys(counts).every((state) => TERMINAL.includes(state));
    if (retry) retry.hidden = !counts.failed;
  }

  function apply(snap) {
    current = snap;
    const counts = countsOf(snap.tasks);
    drawCounts(counts);
    drawTasks(snap.tasks);
    drawButtons(counts);
  }

  // It resolves to the array, so live.js knows the reload is in (an API answer has no seq).
  const resync = () => fetchJSON("/api/v1/arrays/" + arrayId + "/").then((snap) => { apply(snap); return snap; });
  const reload = throttle(() => resync().catch(console.error), 250, 250);

  // The "Array N submitted." note describes the page as it opened: it goes with the first
  // change of a task (as on the job page).
  function dropFlash() {
    document.querySelectorAll(".messages li.success").forEach((li) => li.remove());
    document.querySelectorAll(".messages").forEach((ul) => { if (!ul.children.length) ul.remove(); });
  }

  function onEvent(event) {
    if (event.type === "job.created") { reload(); return; }  // a retried task, maybe ours
    if (typeof event.job !== "number" || typeof event.state !== "string") return;
    const task = current.tasks.find((t) => t.job === event.job);
    if (!task) return;
    dropFlash();
    task.state = event.state;
    if (event.state !== "pending" && event.state !== "queued") task.wait_reason = "";
    apply(current);
    reload();  // the wait reasons of the others (a slot freed, a dependency met)
  }

  apply(current);
  new LiveSocket([{ topic: "tenant", id: tenantId }], { onEvent, resync });
})();
