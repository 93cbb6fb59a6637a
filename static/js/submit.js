// The submit form: show the fields of what is being run (a built-in workload or a program).
(function () {
  "use strict";
  const BUILT_IN = ["workload", "args"];
  const PROGRAM = ["archive", "code", "entrypoint", "launcher", "env"];

  function fieldBox(name) {
    const input = document.querySelector(`#job-form [name="${name}"]`);
    return input ? input.closest(".field") : null;
  }

  function show(source) {
    for (const name of BUILT_IN) {
      const box = fieldBox(name);
      if (box) box.hidden = source === "program";
    }
    for (const name of PROGRAM) {
      const box = fieldBox(name);
      if (box) box.hidden = source !== "program";
    }
  }

  const radios = document.querySelectorAll('#job-form [name="source"]');
  for (const radio of radios) {
    radio.addEventListener("change", () => show(radio.value));
  }
  const checked = document.querySelector('#job-form [name="source"]:checked');
  show(checked ? checked.value : "builtin");
})();
