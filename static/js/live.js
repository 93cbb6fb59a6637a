/* The live-update socket shared by every live page.
 *
 * One WebSocket per page at /ws/live/ (session auth).  On every (re)connect it
 * subscribes to the page's topics and, once all are confirmed, calls the page's
 * resync() to reload a snapshot, so nothing missed while disconnected is lost.
 * Drops are retried with capped exponential backoff.  No dependencies.
 *
 * Events come in batches, one per group and coalescing window:
 *   {"type": "batch", "topic": "tenant", "id": 3, "seq": 17, "events": [...]}
 * The socket keeps each topic's last seq and hands the events to page.onEvent
 * one by one.  A seq that skips one (a batch was lost) reloads the snapshot;
 * nothing else does.  While a snapshot loads, batches wait; once it is in, only
 * those after the seq it carries (snap.seq, when page.resync() resolves to the
 * snapshot) are applied.
 */
(function () {
  "use strict";

  const log = [];  // arrival times of events, read by the browser tests and bench/live.py
  window.__portalLive = { log: log, state: "connecting", connects: 0, resyncs: 0, gaps: 0 };
  const GAP_RESYNC_JITTER_MS = 300;  // many pages that saw the same gap do not reload in step
  const topicKey = (topic, id) => topic + ":" + (id === undefined || id === null ? "" : id);

  function setStatus(state) {
    window.__portalLive.state = state;
    const badge = document.getElementById("live-status");
    if (!badge) return;
    badge.hidden = false;
    badge.dataset.state = state;
    badge.textContent = { live: "● live", connecting: "○ connecting…", reconnecting: "○ reconnecting…", refused: "✕ not allowed" }[state] || state;
    badge.title = state === "live" ? "Updates arrive as they happen" : "Trying to reach the server; the page will catch up when it is back";
  }

  /** A socket refused because the session ended (not because the server is away): go to login. */
  function loggedOutCheck() {
    fetch(location.href, { method: "HEAD", credentials: "same-origin" })
      .then((r) => { if (r.redirected && new URL(r.url).pathname === "/login/") location.reload(); })
      .catch(() => {});  // the server is away: keep retrying
  }

  class LiveSocket {
    /**
     * @param {Array<{topic: string, id?: number}>} topics what to subscribe to
     * @param {{onEvent: function(object): void, resync: function(): void}} page
     */
    constructor(topics, page) {
      this.topics = topics;
      this.page = page;
      this.attempt = 0;
      this.seqs = {};      // topic key -> seq of the last batch applied
      this.loading = false;
      this.held = [];      // batches that came while a snapshot loaded
      this.connect();
    }

    /** Reload the page's snapshot; then apply the batches held meanwhile that it does not reflect. */
    resync() {
      window.__portalLive.resyncs += 1;
      this.loading = true;
      const done = (snap) => {
        this.loading = false;
        this.seqs = {};
        if (snap && typeof snap.seq === "number" && this.topics.length === 1) {
          this.seqs[topicKey(this.topics[0].topic, this.topics[0].id)] = snap.seq;
        }
        const held = this.held;
        this.held = [];
        for (const batch of held) this.onBatch(batch);
      };
      Promise.resolve()
        .then(() => this.page.resync())
        .then(done, (error) => { console.error(error); done(null); });
    }

    /** Apply a batch in order; a missing seq means a lost batch: reload the snapshot. */
    onBatch(batch) {
      if (this.loading) { this.held.push(batch); return; }
      const key = topicKey(batch.topic, batch.id);
      const last = this.seqs[key];
      if (typeof batch.seq === "number" && last !== undefined) {
        if (batch.seq <= last) return;  // the snapshot already reflects it
        if (batch.seq !== last + 1) {
          window.__portalLive.gaps += 1;
          this.loading = true;
          this.held.push(batch);
          setTimeout(() => this.resync(), Math.random() * GAP_RESYNC_JITTER_MS);
          return;
        }
      }
      if (typeof batch.seq === "number") this.seqs[key] = batch.seq;
      const at = performance.timeOrigin + performance.now();
      for (const event of batch.events || []) {
        log.push({ at: at, event: event });
        this.page.onEvent(event);
      }
      if (log.length > 5000) log.splice(0, 1000);
    }

    connect() {
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      const ws = new WebSocket(scheme + "://" + location.host + "/ws/live/");
      this.ws = ws;
      let confirmed = 0;
      setStatus(this.attempt ? "reconnecting" : "connecting");
      ws.onopen = () => {
        for (const t of this.topics) ws.send(JSON.stringify(Object.assign({ type: "subscribe" }, t)));
      };
      ws.onmessage = (message) => {
        const event = JSON.parse(message.data);
        if (event.type === "subscribed") {
          confirmed += 1;
          if (confirmed === this.topics.length) {
            this.attempt = 0;
            window.__portalLive.connects += 1;
            setStatus("live");
            this.resync();
          }
        } else if (event.type === "subscribe.refused") {
          setStatus("refused");
        } else if (event.type === "batch") {
          this.onBatch(event);
        } else if (event.type !== "pong" && event.type !== "unsubscribed") {
          log.push({ at: performance.timeOrigin + performance.now(), event: event });
          if (log.length > 5000) log.splice(0, 1000);
          this.page.onEvent(event);
        }
      };
      ws.onclose = () => {
        const delay = Math.min(4000, 250 * Math.pow(2, this.attempt));
        this.attempt += 1;
        setStatus("reconnecting");
        if (this.attempt >= 3) loggedOutCheck();
        setTimeout(() => this.connect(), delay);
      };
    }
  }

  /** Fetch JSON from the portal with the session cookie; throws on HTTP errors. */
  async function fetchJSON(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(url + ": HTTP " + response.status);
    return response.json();
  }

  /** Run fn at most once per `ms`, after the last call (a trailing debounce). */
  function debounce(fn, ms) {
    let timer = null;
    return function () {
      clearTimeout(timer);
      timer = setTimeout(fn, ms);
    };
  }

  /** Run fn once, `ms` (plus up to `jitter` ms, so that many pages do not reload in step)
   *  after the first of a burst of calls; never starved by a steady stream. */
  function throttle(fn, ms, jitter) {
    let timer = null;
    return function () {
      if (timer !== null) return;
      timer = setTimeout(() => { timer = null; fn(); }, ms + Math.random() * (jitter || 0));
    };
  }

  /** Create an element with text content (never innerHTML: names come from users). */
  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "dataset") Object.assign(node.dataset, v);
      else node.setAttribute(k, v);
    }
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // Time, one way everywhere (the template filters of portal/templatetags/portal_time.py
  // write the same): absolute times as "2026-12-01 13:48:42 UTC", 24-hour, in the portal's
  // zone (UTC); durations as "1 h 32 min"; "3 min ago" where the distance reads better.
  const pad = (n) => String(n).padStart(2, "0");

  /** An ISO time (or Date) as "YYYY-MM-DD HH:MM:SS UTC"; "—" for none or nonsense. */
  function when(value) {
    if (value === null || value === undefined || value === "") return "—";
    const d = value instanceof Date ? value : new Date(value);
    if (Number.isNaN(d.getTime())) return "—";
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " +
      pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()) + " UTC";
  }

  /** A length of time in words: "45 s", "12 min", "1 h 32 min", "2 d 3 h"; "—" for none. */
  function seconds(value) {
    if (value === null || value === undefined || Number.isNaN(Number(value))) return "—";
    const total = Math.max(0, Math.floor(Number(value) + 0.5));
    if (total < 120) return total + " s";
    const minutes = Math.floor((total + 30) / 60);
    if (minutes < 60) return minutes + " min";
    const hours = Math.floor(minutes / 60);
    if (hours < 48) return hours + " h" + (minutes % 60 ? " " + (minutes % 60) + " min" : "");
    const days = Math.floor(hours / 24);
    return days + " d" + (hours % 24 ? " " + (hours % 24) + " h" : "");
  }

  /** How far an ISO time is from now: "just now", "3 min ago", "in 1 h 5 min". */
  function ago(value, now) {
    const d = new Date(value);
    if (value === null || value === undefined || Number.isNaN(d.getTime())) return "—";
    const delta = ((now === undefined ? Date.now() : now) - d.getTime()) / 1000;
    if (Math.abs(delta) < 10) return "just now";
    return delta > 0 ? seconds(delta) + " ago" : "in " + seconds(-delta);
  }

  /** A <time> element: relative text, the absolute time on hover (or the other way round). */
  function timeEl(iso, relative) {
    const node = el("time", { datetime: iso, title: relative ? when(iso) : ago(iso) }, relative ? ago(iso) : when(iso));
    if (relative) node.dataset.relative = "1";
    return node;
  }

  // Relative times age: refresh them every 30 s.
  setInterval(() => {
    document.querySelectorAll("time[data-relative]").forEach((t) => { t.textContent = ago(t.getAttribute("datetime")); });
  }, 30000);

  window.PortalLive = { LiveSocket, fetchJSON, debounce, throttle, el, seconds, when, ago, timeEl, setStatus };
})();
