// The session page: counts down to the idle and lifetime deadlines the page carries
// (data-idle-deadline, data-lifetime-deadline) and reloads the page when the session's
// state changes (read from /api/v1/sessions/<id>/ every few seconds), so it shows the lab
// link once the session runs and its end once it is stopped or culled.
(function () {
  "use strict";
  var root = document.getElementById("session");
  if (!root) {
    return;
  }
  var POLL_MS = 5000;

  function left(iso) {
    var ms = Date.parse(iso) - Date.now();
    if (isNaN(ms)) {
      return "";
    }
    if (ms <= 0) {
      return "now";
    }
    var s = Math.floor(ms / 1000);
    var h = Math.floor(s / 3600);
    var m = Math.floor((s % 3600) / 60);
    var sec = s % 60;
    if (h > 0) {
      return h + " h " + m + " min";
    }
    if (m > 0) {
      return m + " min " + sec + " s";
    }
    return sec + " s";
  }

  function tick() {
    var idle = root.getAttribute("data-idle-deadline");
    var idleEl = document.getElementById("idle-countdown");
    if (idle && idleEl) {
      idleEl.textContent = left(idle);
    }
    var life = root.getAttribute("data-lifetime-deadline");
    var lifeEl = document.getElementById("lifetime-countdown");
    if (life && lifeEl) {
      lifeEl.textContent = "in " + left(life);
    }
  }

  function poll() {
    var id = root.getAttribute("data-session");
    fetch("/api/v1/sessions/" + encodeURIComponent(id) + "/", {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    })
      .then(function (res) {
        return res.ok ? res.json() : null;
      })
      .then(function (session) {
        if (!session) {
          return;
        }
        if (session.state !== root.getAttribute("data-state")) {
          window.location.reload();
          return;
        }
        if (session.idle_deadline) {
          root.setAttribute("data-idle-deadline", session.idle_deadline);
        }
      })
      .catch(function () {
        /* the next poll tries again */
      });
  }

  tick();
  window.setInterval(tick, 1000);
  window.setInterval(poll, POLL_MS);
})();
