/* The API token page: copy the new secret with one click (it is shown only this once). */
(function () {
  "use strict";
  const button = document.getElementById("copy-token");
  const secret = document.getElementById("token");
  if (!button || !secret) return;
  const status = document.getElementById("copy-status");

  /** Select the secret, so a refused clipboard still leaves it one Ctrl+C away. */
  function select() {
    const range = document.createRange();
    range.selectNodeContents(secret);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  async function copy() {
    select();
    try {
      // The Clipboard API exists only in secure contexts (HTTPS or localhost).
      if (navigator.clipboard) await navigator.clipboard.writeText(secret.textContent);
      else if (!document.execCommand("copy")) throw new Error("copy refused");
      status.textContent = "Copied.";
    } catch (error) {
      status.textContent = "Selected: press Ctrl+C (⌘C) to copy.";
    }
  }

  button.hidden = false;
  button.addEventListener("click", copy);
})();
