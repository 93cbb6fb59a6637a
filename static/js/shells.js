/* The admins' page of open shells (/cluster/shells/): redraws its table from open.json every
 * few seconds, so shells that open or end and the bytes they move show without a reload.
 * Rows are built with textContent (names come from users); each Close button is a form
 * POST with the page's CSRF token, as the server-rendered rows have. */
(function () {
  "use strict";
  const { fetchJSON, el, timeEl } = window.PortalLive;
  const card = document.getElementById("open-shells-card");
  if (!card) return;
  const table = document.getElementById("open-shells");
  const body = document.getElementById("open-shells-body");
  const empty = document.getElementById("open-shells-empty");
  const more = document.getElementById("open-shells-more");
  const csrf = document.querySelector("#shell-csrf input[name=csrfmiddlewaretoken]");
  const every = Math.max(1000, Number(card.dataset.refreshMs) || 3000);

  /** Bytes as Django's filesizeformat writes them: "12 bytes", "1.5 KB", "3.0 MB". */
  function size(n) {
    if (n === 1) return "1\u00a0byte";
    if (n < 1024) return n + "\u00a0bytes";
    const units = ["KB", "MB", "GB", "TB"];
    let value = n / 1024;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
    return value.toFixed(1) + "\u00a0" + units[unit];
  }

  function closeForm(shell) {
    const form = el("form", { method: "post", action: card.dataset.json.replace(/open\.json$/, "") + encodeURIComponent(shell.id) + "/close/" });
    form.appendChild(el("input", { type: "hidden", name: "csrfmiddlewaretoken", value: csrf ? csrf.value : "" }));
    form.appendChild(el("button", { class: "danger", type: "submit" }, "Close"));
    return form;
  }

  function row(shell) {
    const tr = el("tr", { dataset: { shell: shell.id, served: shell.served ? "1" : "0" } });
    tr.appendChild(el("td", {}, shell.user));
    tr.appendChild(el("td", {}, shell.tenant));
    const job = el("td");
    job.appendChild(el("a", { href: "/jobs/" + shell.job + "/" }, shell.job));
    job.appendChild(document.createTextNode(" " + shell.job_name));
    tr.appendChild(job);
    const worker = el("td", {}, shell.worker + " ");
    worker.appendChild(el("small", { class: "help" }, "on " + shell.node));
    tr.appendChild(worker);
    const command = el("td");
    command.appendChild(el("code", {}, shell.argv.length ? shell.argv.join(" ") : "login shell"));
    tr.appendChild(command);
    const opened = el("td");
    opened.appendChild(timeEl(shell.opened_at, true));
    tr.appendChild(opened);
    tr.appendChild(el("td", { class: "bytes-in", title: shell.bytes_in + " bytes" }, size(shell.bytes_in)));
    tr.appendChild(el("td", { class: "bytes-out", title: shell.bytes_out + " bytes" }, size(shell.bytes_out)));
    const actions = el("td", { class: "row-actions" });
    actions.appendChild(closeForm(shell));
    tr.appendChild(actions);
    return tr;
  }

  function draw(data) {
    body.replaceChildren(...data.shells.map(row));
    table.hidden = !data.shells.length;
    empty.hidden = data.shells.length > 0;
    more.hidden = data.total <= data.shells.length;
    more.textContent = "Showing the newest " + data.shells.length + " of " + data.total + " open shells.";
    card.dataset.refreshed = String((Number(card.dataset.refreshed) || 0) + 1);
  }

  function refresh() {
    fetchJSON(card.dataset.json).then(draw).catch(() => {}).finally(() => setTimeout(refresh, every));
  }
  setTimeout(refresh, every);
})();
