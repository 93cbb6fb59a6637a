/* The topology editor, live: its server-rendered sections follow the cluster's events.
 *
 * The editor is forms rendered by the server (each with its CSRF token), so it is
 * refreshed the way it was made: on an event of the inventory (a pending server
 * reported, one accepted or forgotten, a server added, removed, drained, its health
 * changed, a GPU marked suspect; a job's move, at most every 3 s) it fetches the page again, parses it with DOMParser
 * (no script runs, no innerHTML) and swaps in each fresh `.live-section`.  What the
 * admin is typing in a section survives the swap (values by row and field name, the
 * focus, an open Type / pool form).  A snapshot is this page itself, so a (re)connect or a lost batch
 * refreshes it the same way.
 */
(function () {
  "use strict";
  const { LiveSocket, throttle } = window.PortalLive;
  if (!document.getElementById("live-topology")) return;
  window.__topologyRefreshes = 0;

  /** Where an input is, as a key that finds it again in the fresh section. */
  function inputKey(input) {
    const row = input.closest("[id]");
    return (row ? row.id : "") + "|" + (input.getAttribute("name") || input.id || "");
  }

  /** The rows whose folded form (a <details>) the admin has open. */
  function openDetails(section) {
    return new Set([...section.querySelectorAll("details[open]")].map((d) => (d.closest("[id]") || {}).id));
  }

  function typedValues(section) {
    const kept = {};
    for (const input of section.querySelectorAll("input:not([type=hidden]), select, textarea")) {
      if (input.value !== input.defaultValue) kept[inputKey(input)] = input.value;
    }
    return kept;
  }

  function restore(section, kept, focused, opened) {
    for (const details of section.querySelectorAll("details")) {
      if (opened.has((details.closest("[id]") || {}).id)) details.open = true;
    }
    for (const input of section.querySelectorAll("input:not([type=hidden]), select, textarea")) {
      const key = inputKey(input);
      if (key in kept) input.value = kept[key];
      if (key === focused) input.focus();
    }
  }

  function swap(fresh) {
    const current = [...document.querySelectorAll(".live-section")].map((s) => s.id).sort();
    const incoming = [...fresh.querySelectorAll(".live-section")].map((s) => s.id).sort();
    if (current.join() !== incoming.join()) { location.reload(); return; }  // a fabric came or went
    for (const id of incoming) {
      const old = document.getElementById(id);
      const next = document.importNode(fresh.getElementById(id), true);
      const active = document.activeElement && old.contains(document.activeElement) ? inputKey(document.activeElement) : null;
      const kept = typedValues(old), opened = openDetails(old);
      old.replaceWith(next);
      restore(next, kept, active, opened);
    }
    const fabric = fresh.getElementById("current-fabric");
    if (fabric) document.getElementById("current-fabric").replaceWith(document.importNode(fabric, true));
    window.__topologyRefreshes += 1;
  }

  async function refresh() {
    const response = await fetch(location.pathname, { credentials: "same-origin", headers: { Accept: "text/html" } });
    if (!response.ok) throw new Error(location.pathname + ": HTTP " + response.status);
    swap(new DOMParser().parseFromString(await response.text(), "text/html"));
  }

  // What the editor shows changes with the inventory's events; a job's move changes only
  // which servers run jobs, so a busy tick refreshes it at most every few seconds.
  const refreshSoon = throttle(() => refresh().catch(console.error), 300);
  const refreshLater = throttle(() => refresh().catch(console.error), 3000);
  const INVENTORY_EVENTS = new Set(["topology.changed", "server.state", "server.health", "gpu.suspect"]);
  const onEvent = (event) => {
    if (INVENTORY_EVENTS.has(event.type)) refreshSoon();
    else if (event.job !== undefined && event.gpus !== undefined) refreshLater();
  };
  new LiveSocket([{ topic: "cluster" }], { onEvent, resync: refresh });
})();
