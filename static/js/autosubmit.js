/* Selects marked data-autosubmit submit their form on change (no inline handlers: CSP). */
(function () {
  "use strict";
  document.addEventListener("change", function (event) {
    const target = event.target;
    if (target instanceof HTMLSelectElement && target.hasAttribute("data-autosubmit") && target.form) {
      target.form.submit();
    }
  });
})();
