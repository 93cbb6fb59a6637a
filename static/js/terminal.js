/* The job page's terminal: a shell in one of the job's workers, in the browser (xterm.js,
 * served from static/vendor/xterm/, never a CDN).
 *
 * It speaks the socket that `portalctl shell` speaks, /ws/jobs/<job>/shell/, with the
 * browser's session: one "open" message (worker, rows, cols), then keystrokes as binary
 * frames, "resize" when the terminal's box changes size (fit addon), "close" from the
 * Close button; the server sends the shell's output as binary frames, then one
 * {"type": "exit", "code"} before it closes the socket.  A refusal is one
 * {"type": "error", "status", "message"} frame (404: no such job, or another tenant's).
 * The page shows how the shell ended; "Open a new shell" starts another (a shell ends
 * with its socket: nothing runs on after the page is left).
 *
 * The card follows the job live, without a socket of its own: job.js keeps the page's
 * model of the job (its snapshot, patched by each live event) and, on every redraw,
 * dispatches it on #live-job as a "portal:job" event, whose `state` and `workers`
 * (jobs.live.patches.live_workers) are the job's now.
 *
 *   job event ──live.js──> job.js model ──redraw──> "portal:job" ──> follow(model)
 *                                                   Worker list, command hint, buttons
 */
(function () {
  "use strict";
  const card = document.getElementById("job-terminal");
  if (!card) return;
  const status = document.getElementById("terminal-status");
  const say = (text, kind) => { status.textContent = text; status.dataset.kind = kind || ""; };
  if (!window.Terminal || !window.FitAddon) {
    say("The terminal could not load (xterm.js is missing from this portal's static files).", "error");
    return;
  }
  const LIVE = ["running", "scaling"];
  const jobId = card.dataset.job;
  const box = document.getElementById("terminal");
  const openButton = document.getElementById("terminal-open");
  const againButton = document.getElementById("terminal-reconnect");
  const closeButton = document.getElementById("terminal-close");
  const workerSelect = document.getElementById("terminal-worker");
  const exitNote = document.getElementById("terminal-exit");
  const encoder = new TextEncoder();
  let term = null;
  let fit = null;
  let socket = null;

  const jobState = () => {
    const badge = document.getElementById("job-state");
    return (badge ? badge.textContent : card.dataset.state || "").trim();
  };
  const opened = () => socket !== null && socket.readyState === WebSocket.OPEN;
  const command = document.getElementById("terminal-command");

  /** The workers the select offers now, in its order (not "the first"). */
  const offered = () => [...workerSelect.options].map((o) => o.value).filter(Boolean);

  /** The help text's `portalctl shell` line names the chosen worker, else the second one
   * (the first is what it opens without --worker), and no worker while there are fewer. */
  function hint() {
    const named = workerSelect.value || offered()[1];
    command.textContent = "portalctl shell " + jobId + (named ? " --worker " + named : "");
  }

  /** Make the select offer exactly `workers` (in their order), keeping the choice if it
   * stays; a chosen worker that went falls back to "the first".  An open shell is left
   * alone: if its worker went, the server ends it and says so. */
  function offer(workers) {
    const wanted = workers.filter((w) => typeof w === "string" && w);
    const current = offered();
    if (wanted.length === current.length && wanted.every((w, i) => w === current[i])) return;
    const chosen = workerSelect.value;
    const first = workerSelect.options[0];
    workerSelect.replaceChildren(first, ...wanted.map((w) => {
      const option = document.createElement("option");
      option.value = w;
      option.textContent = w;
      return option;
    }));
    workerSelect.value = wanted.includes(chosen) ? chosen : "";
    hint();
  }

  let reasonShown = false;
  /** Buttons follow the socket and the job: a shell opens only while the job runs. */
  function sync() {
    const live = LIVE.includes(jobState());
    const busy = socket !== null;
    openButton.hidden = busy || card.dataset.used === "1";
    againButton.hidden = busy || card.dataset.used !== "1";
    openButton.disabled = againButton.disabled = !live;
    closeButton.hidden = !busy;
    workerSelect.disabled = busy;
    if (!live && !busy) {
      say("A shell opens while the job runs (it is " + jobState() + ").");
      reasonShown = true;
    } else if (live && reasonShown) {
      say("");
      reasonShown = false;
    }
  }

  /** After each redraw of the page: the workers of the page's model of the job, then the
   * buttons. A job that does not run has none, whatever an older message said. */
  function follow(event) {
    const model = event.detail || {};
    const running = LIVE.includes(model.state || jobState());
    const workers = running ? (Array.isArray(model.workers) ? model.workers : null) : [];
    if (workers !== null) offer(workers);
    sync();
  }

  function sendJSON(message) {
    if (opened()) socket.send(JSON.stringify(message));
  }

  function ensureTerminal() {
    if (term) return;
    term = new window.Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, fontFamily: "ui-monospace, Menlo, Consolas, monospace" });
    fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    box.hidden = false;
    term.open(box);
    fit.fit();
    term.onData((data) => { if (opened()) socket.send(encoder.encode(data)); });
    term.onBinary((data) => {
      if (opened()) socket.send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff));
    });
    term.onResize((size) => sendJSON({ type: "resize", rows: size.rows, cols: size.cols }));
    let pending = null;
    const refit = () => {
      if (pending) return;
      pending = requestAnimationFrame(() => { pending = null; if (!box.hidden) fit.fit(); });
    };
    new ResizeObserver(refit).observe(box);
    window.addEventListener("resize", refit);
  }

  /** How a shell ended, in words: its exit code, the signal that killed it, or why. */
  function ending(message) {
    if (message.code === null || message.code === undefined) return "Shell ended: " + (message.reason || "no exit status");
    if (message.code < 0) return "Shell killed by signal " + (-message.code) + (message.reason ? " (" + message.reason + ")" : "");
    return "Shell exited with code " + message.code + (message.reason ? " (" + message.reason + ")" : "");
  }

  function connect() {
    ensureTerminal();
    term.reset();
    exitNote.hidden = true;
    delete card.dataset.exitCode;
    card.dataset.used = "1";
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(scheme + location.host + "/ws/jobs/" + jobId + "/shell/");
    ws.binaryType = "arraybuffer";
    socket = ws;
    let ended = false;
    reasonShown = false;
    say("Connecting…");
    sync();
    ws.onopen = () => {
      fit.fit();
      const open = { type: "open", term: "xterm-256color", rows: term.rows, cols: term.cols };
      if (workerSelect.value) open.worker = workerSelect.value;
      ws.send(JSON.stringify(open));
    };
    ws.onmessage = (event) => {
      if (typeof event.data !== "string") { term.write(new Uint8Array(event.data)); return; }
      let message;
      try { message = JSON.parse(event.data); } catch (_) { return; }
      if (message.type === "opened") {
        card.dataset.shell = message.shell;
        say("Connected: " + message.worker + " on " + message.node + ".", "ok");
        term.focus();
      } else if (message.type === "exit") {
        ended = true;
        card.dataset.exitCode = message.code === null ? "" : String(message.code);
        exitNote.textContent = ending(message);
        exitNote.hidden = false;
        say("");
      } else if (message.type === "error") {
        say(message.message + " (" + message.status + ")", "error");
      }
    };
    ws.onclose = (event) => {
      if (socket === ws) socket = null;
      // A refusal said why already; a socket that drops without an exit says so.
      if (!ended && status.dataset.kind !== "error") say("Disconnected (" + event.code + ") before the shell ended.", "error");
      sync();
    };
  }

  openButton.addEventListener("click", connect);
  againButton.addEventListener("click", connect);
  closeButton.addEventListener("click", () => sendJSON({ type: "close" }));
  workerSelect.addEventListener("change", hint);
  // job.js announces every redraw of its model of the job: the card follows.
  const page = document.getElementById("live-job");
  if (page) page.addEventListener("portal:job", follow);
  hint();
  sync();
})();
