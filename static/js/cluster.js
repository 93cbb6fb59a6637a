/* The admin cluster view: topology with per-job colours, allocation heatmap,
 * queue/efficiency timeline and JCT statistics; patched from the cluster's events. */
(function () {
  "use strict";
  const { LiveSocket, fetchJSON, throttle, el, seconds, when } = window.PortalLive;
  const { maxOf, axis, countAxis, percentAxis, timeAxis, durationUnit, cdf, note, draw, showEmpty } = window.PortalCharts;
  const root = document.getElementById("live-cluster");
  if (!root) return;
  const PALETTE = ["#2f6fed", "#e4572e", "#17a398", "#9b5de5", "#f3a712", "#d81159", "#3bb273", "#8f2d56", "#0081a7", "#c2711f", "#5c6bc0", "#6a994e"];
  const IDLE = "#d5dae2", DOWN = "#59606b", LINK = "#b9c1cd", SERVER_LINK = "#9aa3b2", SUSPECT = "#c2410c";
  const colourOf = (job) => PALETTE[(Number(job) * 7) % PALETTE.length];
  window.__clusterColour = colourOf;

  function serverState(snap) {
    const map = {};
    for (const s of snap.servers) map[s.leaf + ":" + s.slot] = s;
    return map;
  }

  // GPUs in a straggler's cool-down, by index; the words their hover and title give.
  function suspectOf(snap) {
    const map = {};
    for (const m of snap.suspect || []) map[m.gpu] = m;
    return map;
  }
  const suspectNote = (m) => "suspect until " + when(m.until) + ": " + m.reason;

  /** The list of suspect GPUs, each item titled with until and why (textContent only). */
  function drawSuspects(snap) {
    const list = document.getElementById("suspect-gpus");
    if (!list) return;
    list.replaceChildren();
    for (const m of snap.suspect || []) {
      const item = el("li", { "data-gpu": m.gpu, title: suspectNote(m) });
      item.appendChild(el("span", { class: "swatch key-suspect" }));
      item.appendChild(el("span", {}, "GPU " + m.gpu + " · " + m.node + ":" + m.local + " · suspect until " + when(m.until) + (m.job ? " · job " + m.job : "")));
      list.appendChild(item);
    }
  }

  const typeColour = (snap, type) => (snap.type_colours || {})[type] || "#8a94a6";
  const typeSwatch = (snap, type) => el("span", { class: "swatch type-swatch", "data-type": type, style: "background:" + typeColour(snap, type) });
  const cell = (text, attrs) => el("td", attrs || {}, text);

  /** The key of the server squares' colours: one entry per GPU type, with its servers. */
  function drawTypeLegend(snap) {
    const list = document.getElementById("type-legend");
    if (!list) return;
    list.replaceChildren();
    const servers = {};
    for (const s of snap.servers) servers[s.gpu_type] = (servers[s.gpu_type] || 0) + 1;
    for (const type of Object.keys(servers).sort()) {
      const item = el("li", { "data-type": type });
      item.appendChild(typeSwatch(snap, type));
      item.appendChild(el("span", {}, "server of type " + type + " (" + servers[type] + ")"));
      list.appendChild(item);
    }
  }

  /** GPUs and GPUs held per type, from the model's GPU rows (index, leaf, slot, local, job, type). */
  function typeCounts(snap) {
    const counts = {};
    for (const row of snap.gpus) {
      const entry = counts[row[5]] || (counts[row[5]] = { gpus: 0, held: 0 });
      entry.gpus += 1;
      if (row[4] !== null) entry.held += 1;
    }
    return counts;
  }

  function drawTypes(snap) {
    const body = document.getElementById("types-body");
    if (!body) return;
    const counts = typeCounts(snap);
    body.replaceChildren();
    for (const type of Object.keys(counts).sort()) {
      const c = counts[type];
      const row = el("tr", { "data-type": type });
      const name = el("td");
      name.appendChild(typeSwatch(snap, type));
      name.appendChild(document.createTextNode(type));
      row.append(name, cell(c.gpus), cell(c.held), cell(Math.round(100 * c.held / c.gpus) + "%"));
      body.appendChild(row);
    }
    document.getElementById("types-empty").hidden = Object.keys(counts).length > 0;
    const byType = (snap.timeline || {}).utilization_by_type || {};
    const types = Object.keys(byType).sort();
    if (!types.length) { showEmpty("types-chart", "No GPUs yet."); return; }
    draw("types-chart", types.map((type) => ({ x: snap.timeline.t, y: byType[type], name: type, type: "scatter", mode: "lines", line: { shape: "hv", color: typeColour(snap, type) }, hovertemplate: type + ": %{y:.0%} in use<extra></extra>" })),
      { showlegend: true, legend: { orientation: "h", y: 1.18 }, margin: { l: 56, r: 20, t: 10, b: 48 }, xaxis: timeAxis(), yaxis: percentAxis("Share of the type's GPUs in use") });
  }

  /** Servers by pool label: servers, their types, GPUs and GPUs held now. */
  function drawPools(snap) {
    const body = document.getElementById("pools-body");
    if (!body) return;
    const pools = {}, poolAt = {};
    for (const s of snap.servers) {
      const entry = pools[s.pool] || (pools[s.pool] = { servers: 0, types: new Set(), gpus: 0, held: 0 });
      entry.servers += 1;
      entry.types.add(s.gpu_type);
      poolAt[s.leaf + ":" + s.slot] = s.pool;
    }
    for (const row of snap.gpus) {
      const entry = pools[poolAt[row[1] + ":" + row[2]]];
      if (!entry) continue;
      entry.gpus += 1;
      if (row[4] !== null) entry.held += 1;
    }
    body.replaceChildren();
    for (const pool of Object.keys(pools).sort()) {
      const p = pools[pool];
      const row = el("tr", { "data-pool": pool });
      row.append(cell(pool || "none"), cell(p.servers), cell([...p.types].sort().join(", ")), cell(p.gpus), cell(p.held));
      body.appendChild(row);
    }
    document.getElementById("pools-empty").hidden = Object.keys(pools).length > 0;
  }

  /** The pending servers, each with the page's Accept and Forget forms (cloned, CSRF token inside). */
  function drawPending(snap) {
    const body = document.getElementById("pending-body");
    const actions = document.getElementById("pending-actions");
    if (!body || !actions) return;
    const rows = snap.pending || [];
    body.replaceChildren();
    for (const p of rows) {
      const row = el("tr", { id: "pending-" + p.node, "data-pending": p.id });
      row.append(cell(p.node), cell(p.gpu_source === "none" ? "not reported" : p.gpus), cell(p.gpu_model), cell(p.last_seen), cell(p.note || "", { class: "pending-note" }));
      const forms = el("td", { class: "row-actions" });
      forms.appendChild(actions.content.cloneNode(true));
      for (const input of forms.querySelectorAll("input[name=pending]")) input.value = p.id;
      row.appendChild(forms);
      body.appendChild(row);
    }
    document.getElementById("pending-servers").hidden = rows.length === 0;
  }

  /** One GPU's health as the servers table words it (NVML's figures, or "not reported"). */
  function gpuHealthText(g) {
    const h = g.health;
    const q = (v) => (v === null || v === undefined ? "?" : v);
    const words = h ? q(h.temperature_c) + " °C, " + q(h.utilization_pct) + "%, " + (h.memory_used_mib == null ? "?" : Math.round(h.memory_used_mib)) + " MiB, ECC " + q(h.ecc_uncorrected) + (h.xid ? ", XID " + h.xid : "") : "not reported";
    return g.local + ": " + words + (g.suspect ? " (out of service)" : "");
  }

  /** The servers table from the API's rows (GET /api/v1/servers/: type, pool, state, health). */
  function drawServerRows(rows) {
    const body = document.getElementById("servers-health-body");
    if (!body) return;
    body.replaceChildren();
    for (const s of rows) {
      const row = el("tr", { id: "health-" + s.node, "data-state": s.state, "data-health": s.health });
      const type = cell(s.gpu_type, { title: s.gpu_model || "model not reported" });
      const state = cell(s.state);
      if (s.state_reason) { state.appendChild(document.createTextNode(" ")); state.appendChild(el("small", { class: "help server-reason" }, s.state_reason)); }
      const gpus = el("td");
      s.gpus.forEach((g, i) => {
        if (i) gpus.appendChild(document.createTextNode("; "));
        gpus.appendChild(el("span", { class: "gpu-health" + (g.suspect ? " suspect" : ""), title: "GPU " + g.index + " " + g.uuid }, gpuHealthText(g)));
      });
      row.append(cell(s.node), cell(s.leaf + "/" + s.slot), type, cell(s.pool || "—"), state, cell(s.health), gpus);
      body.appendChild(row);
    }
    document.getElementById("servers-section").hidden = rows.length === 0;
  }

  function drawTopology(snap) {
    const f = snap.fabric;
    const servers = serverState(snap);
    const width = Math.max(f.leaves * f.gpus_per_leaf, f.spines, 1);
    const spineX = (s) => (s + 0.5) * width / f.spines;
    const leafX = (l) => (l + 0.5) * width / f.leaves;
    const gpuX = (leaf, port) => leaf * width / f.leaves + (port + 0.5) * (width / f.leaves) / f.gpus_per_leaf;
    const traces = [];
    // idle cables: one grey trace; reserved ones: per job
    const reserved = {};
    for (const [leaf, port, spine, job] of snap.cables) reserved[leaf + ":" + port] = job;
    const idle = { x: [], y: [], mode: "lines", line: { color: LINK, width: 1, dash: "dot" }, hoverinfo: "skip", name: "idle links" };
    const byJob = {};
    for (let leaf = 0; leaf < f.leaves; leaf++) {
      for (let port = 0; port < f.gpus_per_leaf; port++) {
        const spine = port % f.spines;
        const job = reserved[leaf + ":" + port];
        const target = job === undefined ? idle : (byJob[job] = byJob[job] || { links: { x: [], y: [] }, gpus: { x: [], y: [], text: [] } }).links;
        const offset = (Math.floor(port / f.spines) - (f.gpus_per_leaf / f.spines - 1) / 2) * 0.08;
        target.x.push(leafX(leaf) + offset, spineX(spine) + offset, null);
        target.y.push(2, 3, null);
      }
    }
    traces.push(idle);
    // GPUs: idle, down/draining, or the job's colour
    const idleGpus = { x: [], y: [], text: [] }, downGpus = { x: [], y: [], text: [] }, suspectGpus = { x: [], y: [], text: [] };
    const suspect = suspectOf(snap);
    for (const [index, leaf, slot, local, job] of snap.gpus) {
      const x = gpuX(leaf, slot * f.gpus_per_server + local);
      const s = servers[leaf + ":" + slot];
      const label = "GPU " + index + " · " + s.node + ":" + local + (suspect[index] ? " · " + suspectNote(suspect[index]) : "");
      if (suspect[index]) { suspectGpus.x.push(x); suspectGpus.y.push(0.6); suspectGpus.text.push(label + (job !== null ? " · job " + job : "")); }
      if (job !== null) {
        const entry = (byJob[job] = byJob[job] || { links: { x: [], y: [] }, gpus: { x: [], y: [], text: [] } });
        entry.gpus.x.push(x); entry.gpus.y.push(0.6); entry.gpus.text.push(label + " · job " + job);
      } else if (s.state !== "up") {
        downGpus.x.push(x); downGpus.y.push(0.6); downGpus.text.push(label + " · " + s.state);
      } else {
        idleGpus.x.push(x); idleGpus.y.push(0.6); idleGpus.text.push(label + " · idle");
      }
    }
    // switches and servers, each labelled; servers hang off their leaf by one link each
    const spineName = (i) => "spine " + i, leafName = (i) => "leaf " + i;
    traces.push({ x: [...Array(f.spines).keys()].map(spineX), y: Array(f.spines).fill(3), mode: "markers+text", marker: { symbol: "square", size: 18, color: "#141a26" }, text: [...Array(f.spines).keys()].map(spineName), textposition: "top center", hoverinfo: "text", name: "spines" });
    traces.push({ x: [...Array(f.leaves).keys()].map(leafX), y: Array(f.leaves).fill(2), mode: "markers+text", marker: { symbol: "square", size: 18, color: "#3b4456" }, text: [...Array(f.leaves).keys()].map(leafName), textposition: "middle right", hoverinfo: "text", name: "leaves" });
    const srv = { x: [], y: [], text: [], hover: [], color: [] };
    const uplinks = { x: [], y: [], mode: "lines", line: { color: SERVER_LINK, width: 1.5 }, hoverinfo: "skip", name: "server-leaf links" };
    const labelServers = snap.servers.length <= 24;  // beyond that the names overlap: hover only
    for (const s of snap.servers) {
      const x = gpuX(s.leaf, (s.slot + 0.5) * f.gpus_per_server - 0.5);
      srv.x.push(x);
      srv.y.push(1.1);
      srv.text.push(labelServers ? s.node : "");
      const kind = (s.gpu_type ? " · " + s.gpu_type : "") + (s.pool ? " · pool " + s.pool : "") + (s.health ? " · health " + s.health : "");
      srv.hover.push(s.node + " · leaf " + s.leaf + " · " + f.gpus_per_server + " GPUs" + kind + " · " + s.state + (s.reason ? ": " + s.reason : ""));
      srv.color.push(s.state === "up" ? typeColour(snap, s.gpu_type) : DOWN);
      uplinks.x.push(x, leafX(s.leaf), null);
      uplinks.y.push(1.1, 2, null);
    }
    traces.splice(1, 0, uplinks);  // under the switches, over nothing
    traces.push({ x: srv.x, y: srv.y, mode: "markers+text", marker: { symbol: "square", size: 12, color: srv.color }, text: srv.text, hovertext: srv.hover, textposition: "middle right", textfont: { size: 10, color: "#3b4456" }, hoverinfo: "text", name: "servers" });
    const gpuSize = Math.max(5, Math.min(14, 700 / width));
    traces.push({ x: idleGpus.x, y: idleGpus.y, text: idleGpus.text, mode: "markers", marker: { size: gpuSize, color: IDLE }, hoverinfo: "text", name: "idle GPUs" });
    traces.push({ x: downGpus.x, y: downGpus.y, text: downGpus.text, mode: "markers", marker: { size: gpuSize, color: DOWN, symbol: "x" }, hoverinfo: "text", name: "down GPUs" });
    const legend = document.getElementById("job-legend");
    legend.replaceChildren();
    for (const job of Object.keys(byJob).sort((a, b) => a - b)) {
      const colour = colourOf(job), info = snap.jobs[job] || {};
      traces.push({ x: byJob[job].links.x, y: byJob[job].links.y, mode: "lines", line: { color: colour, width: 3 }, hoverinfo: "skip", name: "job " + job + " links" });
      traces.push({ x: byJob[job].gpus.x, y: byJob[job].gpus.y, text: byJob[job].gpus.text, mode: "markers", marker: { size: gpuSize + 2, color: colour }, hoverinfo: "text", name: "job " + job });
      const item = el("li", { "data-job": job });
      item.appendChild(el("span", { class: "swatch", style: "background:" + colour }));
      const link = el("a", { href: "/jobs/" + job + "/" }, "job " + job);
      item.appendChild(link);
      const links = byJob[job].links.x.length / 3;
      item.appendChild(el("span", {}, " " + (info.name || "") + " · " + (info.tenant || "") + " · " + byJob[job].gpus.x.length + " GPUs, " + links + (links === 1 ? " link" : " links")));
      if (links === 0) item.appendChild(el("span", { class: "help" }, " (inside one leaf: its GPUs talk through the leaf switch, so vClos reserves no spine links)"));
      legend.appendChild(item);
    }
    if (!Object.keys(byJob).length) legend.appendChild(el("li", { class: "help" }, "No job holds GPUs right now."));
    // Suspect GPUs on top, framed: a job's colour inside when a job still holds one.
    traces.push({ x: suspectGpus.x, y: suspectGpus.y, text: suspectGpus.text, mode: "markers", marker: { size: gpuSize + 9, color: SUSPECT, symbol: "diamond-open", line: { width: 2 } }, hoverinfo: "text", name: "suspect GPUs" });
    // A drawing, not a chart: its axes are positions, hidden on purpose.
    draw("topology", traces, { height: 380, margin: { l: 10, r: 10, t: 20, b: 10 }, hovermode: "closest",
      xaxis: { visible: false, range: [-0.5, width + 0.5] }, yaxis: { visible: false, range: [0.3, 3.45] } });
  }

  // Heatmap values: down or draining, idle, or 0.05-1 the holding job's efficiency (1 when
  // not profiled yet); on the -1..1 scale each band has its own stretch of the colour bar.
  const DOWN_Z = -1, IDLE_Z = -0.3;
  const HEAT_SCALE = [[0, DOWN], [0.2, DOWN], [0.2, IDLE], [0.5, IDLE], [0.5, "#c9d8fb"], [1, "#1a4fc4"]];

  function drawHeatmap(snap) {
    const f = snap.fabric;
    const servers = serverState(snap);
    const suspect = suspectOf(snap);
    const z = [], text = [];
    for (let leaf = 0; leaf < f.leaves; leaf++) { z.push(Array(f.gpus_per_leaf).fill(null)); text.push(Array(f.gpus_per_leaf).fill("no server")); }
    for (const [index, leaf, slot, local, job] of snap.gpus) {
      const s = servers[leaf + ":" + slot];
      const port = slot * f.gpus_per_server + local;
      const eff = job === null ? null : (snap.jobs[job] || {}).gpu_efficiency;
      z[leaf][port] = s.state !== "up" && job === null ? DOWN_Z : job === null ? IDLE_Z : eff == null ? 1 : Math.max(0.05, eff);
      text[leaf][port] = "GPU " + index + " · " + s.node + " · " + (job === null ? (s.state === "up" ? "idle" : s.state) : "job " + job + (eff == null ? " (not profiled yet)" : " · " + (eff * 100).toFixed(0) + "% efficient")) + (suspect[index] ? " · " + suspectNote(suspect[index]) : "");
    }
    const x = [];
    const short = f.gpus_per_leaf > 12;  // many columns: "0/1" rather than "server 0 · GPU 1"
    for (let slot = 0; slot < f.servers_per_leaf; slot++) for (let g = 0; g < f.gpus_per_server; g++) x.push(short ? slot + "/" + g : "server " + slot + " · GPU " + g);
    const colorbar = { title: { text: "Useful work", side: "right" }, tickmode: "array", tickvals: [-0.8, -0.3, 0.5, 1], ticktext: ["down", "idle", "50%", "100%"], thickness: 12, len: 1, outlinewidth: 0 };
    const marked = { x: [], y: [], text: [], type: "scatter", mode: "markers", marker: { symbol: "diamond-open", size: 16, color: SUSPECT, line: { width: 2 } }, hoverinfo: "text", name: "suspect GPUs", showlegend: false };
    for (const [index, leaf, slot, local] of snap.gpus) {
      if (!suspect[index]) continue;
      marked.x.push(x[slot * f.gpus_per_server + local]); marked.y.push("leaf " + leaf); marked.text.push(text[leaf][slot * f.gpus_per_server + local]);
    }
    draw("heatmap", [{ z: z, x: x, y: [...Array(f.leaves).keys()].map((l) => "leaf " + l), text: text, type: "heatmap", hoverinfo: "text", zmin: -1, zmax: 1, xgap: 2, ygap: 2, showscale: true, colorbar: colorbar,
      colorscale: HEAT_SCALE }, marked],
      { height: Math.max(200, 40 * f.leaves + 100), xaxis: axis(short ? "Server / GPU within the leaf" : "Server and GPU within the leaf", { type: "category", tickangle: -40, showgrid: false }), yaxis: axis("Leaf switch", { autorange: "reversed", type: "category", showgrid: false }) });
  }

  function drawTimeline(snap) {
    const t = snap.timeline;
    draw("timeline", [
      { x: t.t, y: t.queue, name: "queue length", type: "scatter", mode: "lines", line: { shape: "hv", color: "#b7791f" }, hovertemplate: "%{y} jobs queued<extra></extra>" },
      { x: t.t, y: t.efficiency, name: "efficiency", type: "scatter", mode: "lines", line: { shape: "hv", color: "#1e8e3e" }, yaxis: "y2", hovertemplate: "%{y:.0%} efficient<extra></extra>" },
    ], { showlegend: true, legend: { orientation: "h", y: 1.18 }, margin: { l: 56, r: 56, t: 10, b: 48 }, xaxis: timeAxis(),
      yaxis: countAxis("Jobs queued", maxOf(t.queue, 1)),
      yaxis2: percentAxis("Cluster efficiency", { overlaying: "y", side: "right", showgrid: false }) });
  }

  function drawJct(snap) {
    const j = snap.jct;
    document.getElementById("jct-count").textContent = j.count;
    document.getElementById("jct-mean").textContent = seconds(j.mean);
    document.getElementById("jct-median").textContent = seconds(j.median);
    document.getElementById("jct-p95").textContent = seconds(j.p95);
    if (!j.values.length) { showEmpty("jct-cdf", "No job completed in this window yet."); return; }
    const values = j.values.slice().sort((a, b) => a - b);
    const unit = durationUnit(values[values.length - 1]);
    const points = cdf(values, unit.seconds);
    const wide = values[values.length - 1] > 100 * Math.max(1, values[0]);
    draw("jct-cdf", [{ x: points.x, y: points.y, type: "scatter", mode: "lines+markers", marker: { size: 6 }, line: { shape: "hv", color: "#2f6fed" }, hovertemplate: "%{x:.3~f} " + unit.unit + ": %{y:.0%} of jobs done<extra></extra>" }],
      { xaxis: axis("JCT (" + unit.unit + ")", { type: wide ? "log" : "linear", rangemode: wide ? "normal" : "tozero" }), yaxis: percentAxis("Jobs finished within"),
        annotations: values.length === 1 ? [note("One job so far")] : [] });
  }

  function apply(snap) {
    document.getElementById("tile-queue").textContent = snap.queue_length;
    drawJct(snap);
    drawPending(snap);
    const body = document.getElementById("cluster-body");
    const empty = document.getElementById("cluster-empty");
    if (!snap.fabric) { body.hidden = true; if (empty) empty.hidden = false; return; }
    body.hidden = false;
    if (empty) empty.hidden = true;
    const tot = snap.totals;
    document.getElementById("tile-allocated").textContent = tot.allocated + " / " + tot.gpus;
    document.getElementById("tile-down").textContent = tot.down;
    document.getElementById("tile-cables").textContent = tot.cables_reserved + " / " + tot.cables;
    const eff = snap.timeline.efficiency[snap.timeline.efficiency.length - 1];
    document.getElementById("tile-eff").textContent = eff === null || eff === undefined ? "—" : (eff * 100).toFixed(0) + "%";
    drawTopology(snap);
    drawSuspects(snap);
    drawHeatmap(snap);
    drawTimeline(snap);
    drawTypeLegend(snap);
    drawTypes(snap);
    drawPools(snap);
    window.__clusterSnapshot = snap;
  }

  // The page's model: the snapshot, patched by the cluster group's events, which say
  // what changed (jobs.live.patches): a job's GPUs, cables, name and efficiency; the
  // queue length; a server's state.  The page redraws from the model; it reloads the
  // snapshot on open, on a reconnect or seq gap (live.js), when the topology itself
  // changed (an event cannot carry a whole topology) and for any event it cannot patch.
  let current = null;
  let gpuRows = {};  // GPU index -> its row in current.gpus
  const WINDOW_SECONDS = { "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800 };
  const TIMELINE_POINTS = 600;  // as the server thins it (portal/cluster_timeline.py)

  function adopt(snap) {
    current = snap;
    gpuRows = {};
    for (const row of snap.gpus || []) gpuRows[row[0]] = row;
    apply(snap);
  }

  /** Linear-interpolated percentile of sorted values, as jobs.stats.percentile. */
  function percentile(sorted, q) {
    const pos = (sorted.length - 1) * q / 100, lo = Math.floor(pos), hi = Math.ceil(pos);
    return sorted[lo] * (1 - (pos - lo)) + sorted[hi] * (pos - lo);
  }

  function addJct(seconds) {
    const j = current.jct;
    j.values.push(seconds);
    const sorted = j.values.slice().sort((a, b) => a - b);
    Object.assign(j, { count: sorted.length, mean: sorted.reduce((a, b) => a + b, 0) / sorted.length, median: percentile(sorted, 50), p95: percentile(sorted, 95) });
  }

  function recount() {
    const spec = current.fabric;
    const tot = current.totals;
    tot.allocated = current.gpus.filter((g) => g[4] !== null).length;
    tot.cables_reserved = current.cables.length;
    tot.down = current.servers.filter((s) => s.state !== "up").length * spec.gpus_per_server;
  }

  /** A point at the end of the timeline for the state the model is in now. */
  function extendTimeline() {
    const t = current.timeline;
    let speedups = 0;
    for (const info of Object.values(current.jobs)) speedups += info.speedup || 0;
    const used = current.totals.allocated;
    t.t.push(new Date().toISOString());
    t.queue.push(current.queue_length);
    t.gpus_in_use.push(used);
    t.efficiency.push(current.totals.gpus ? Math.round(speedups / current.totals.gpus * 10000) / 10000 : null);
    const byType = t.utilization_by_type || (t.utilization_by_type = {});
    const counts = typeCounts(current);
    for (const type of Object.keys(byType)) {
      const c = counts[type];
      byType[type].push(c && c.gpus ? Math.round(c.held / c.gpus * 10000) / 10000 : null);
    }
    const span = WINDOW_SECONDS[current.window];
    const keys = ["t", "queue", "gpus_in_use", "efficiency"];
    const cutTypes = (from) => { for (const type of Object.keys(byType)) byType[type].splice(0, from); };
    if (span) {
      const start = Date.now() - span * 1000;
      let cut = 0;
      while (cut < t.t.length - 1 && Date.parse(t.t[cut]) < start) cut += 1;
      if (cut) { for (const key of keys) t[key].splice(0, cut); cutTypes(cut); }
    }
    if (t.t.length > 2 * TIMELINE_POINTS) {  // thin evenly, keeping the newest point
      const step = t.t.length / TIMELINE_POINTS;
      const keep = new Set([...Array(TIMELINE_POINTS).keys()].map((i) => Math.floor(i * step)).concat([t.t.length - 1]));
      for (const key of keys) t[key] = t[key].filter((_, i) => keep.has(i));
      for (const type of Object.keys(byType)) byType[type] = byType[type].filter((_, i) => keep.has(i));
    }
  }

  /** A job's change: where it is now (its GPUs and cables), its legend entry, its JCT. */
  function patchJob(event) {
    if (!current.fabric || !Array.isArray(event.gpus)) return;
    const key = String(event.job);
    const before = current.jobs[key];
    for (const row of current.gpus) if (row[4] === event.job) row[4] = null;
    for (const index of event.gpus) if (gpuRows[index]) gpuRows[index][4] = event.job;
    current.cables = current.cables.filter((c) => c[3] !== event.job);
    for (const [leaf, port] of event.cables || []) current.cables.push([leaf, port, port % current.fabric.spines, event.job]);
    if (event.gpus.length || (event.cables || []).length) {
      current.jobs[key] = { name: event.name, tenant: (current.tenants || {})[event.tenant] || String(event.tenant), state: event.state, parallelism: event.parallelism, gpu_efficiency: event.gpu_efficiency, speedup: event.speedup };
    } else {
      delete current.jobs[key];
    }
    // A completion counts once: the job held GPUs in this model until now.
    if (event.state === "completed" && event.jct_seconds !== null && event.jct_seconds !== undefined && before && before.state !== "completed") addJct(event.jct_seconds);
    recount();
  }

  /** A server's state and reason in the servers table, in place (its health is unchanged). */
  function patchServerRow(server) {
    const row = document.getElementById("health-" + server.node);
    if (!row) return;
    row.dataset.state = server.state;
    const state = row.children[4];
    state.replaceChildren(document.createTextNode(server.state));
    if (server.reason) { state.appendChild(document.createTextNode(" ")); state.appendChild(el("small", { class: "help server-reason" }, server.reason)); }
  }

  function patchServer(event) {
    const server = (current.servers || []).find((s) => s.node === event.node);
    if (!server) { resyncSoon(); return; }  // a server this model does not know: reload
    server.state = event.state;
    server.reason = typeof event.reason === "string" ? event.reason : event.state === "up" ? "" : server.reason;
    patchServerRow(server);
    recount();
  }

  const render = throttle(() => { if (current.fabric) extendTimeline(); apply(current); }, 250);

  function onEvent(event) {
    if (!current) return;
    if (event.type === "cluster.queue") current.queue_length = event.queue_length;
    else if (event.type === "server.state") { if (current.fabric) patchServer(event); }
    else if (event.job !== undefined && event.gpus !== undefined) patchJob(event);
    else { resyncSoon(); return; }  // the topology changed, or news this page cannot patch
    render();
  }

  // It resolves to the snapshot, so that live.js learns the seq it reflects.
  // The servers' health rows are not in the snapshot (too large): read after each reload.
  const reloadServerRows = () => fetchJSON("/api/v1/servers/").then(drawServerRows).catch(console.error);
  const resync = () => fetchJSON("/live/cluster.json?window=" + encodeURIComponent(root.dataset.window)).then((snap) => { adopt(snap); reloadServerRows(); return snap; });
  const resyncSoon = throttle(() => resync().catch(console.error), 500);
  adopt(JSON.parse(document.getElementById("cluster-snapshot").textContent));
  new LiveSocket([{ topic: "cluster" }], { onEvent, resync });
})();
