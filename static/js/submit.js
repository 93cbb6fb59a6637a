// The submit form: show the fields of what is being run (a built-in workload or a program),
// and the chosen workload's arguments (default, range, meaning) and default batch.
(function () {
  "use strict";
  const BUILT_IN = ["workload", "args"];
  // An array runs a program (its tasks read TASK_ID from their environment).
  const PROGRAM = ["archive", "code", "entrypoint", "launcher", "env", "environment", "array_size", "array_max_running"];

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

  const guideData = document.getElementById("workload-guide");
  const guide = guideData ? JSON.parse(guideData.textContent) : {};
  const workloadSelect = document.getElementById("id_workload");
  const argsBox = fieldBox("args");
  const batchInput = document.getElementById("id_batch_size");
  /** 100000 as "100 000" (narrow no-break spaces), small values as written (1e-6). */
  const number = (v) => (typeof v === "number" && Number.isInteger(v) ? v.toLocaleString("en-US").replace(/,/g, "\u202f") : String(v));

  /** The arguments list under the Arguments box, for the workload chosen now. */
  function showArguments() {
    if (!workloadSelect || !argsBox) return;
    const spec = guide[workloadSelect.value];
    let list = document.getElementById("workload-args");
    if (!list) {
      list = document.createElement("dl");
      list.id = "workload-args";
      list.className = "kv arg-guide";
      argsBox.appendChild(list);
    }
    list.replaceChildren();
    if (!spec) return;
    argsBox.style.gridColumn = "1 / -1";  // the list reads better across the form
    const about = document.createElement("dt");
    about.textContent = workloadSelect.value;
    const what = document.createElement("dd");
    what.textContent = spec.description + " Default global batch: " + spec.default_batch_size + ".";
    list.append(about, what);
    for (const arg of spec.args) {
      const dt = document.createElement("dt");
      const code = document.createElement("code");
      code.textContent = arg.name;
      dt.appendChild(code);
      const dd = document.createElement("dd");
      dd.dataset.arg = arg.name;
      dd.textContent = arg.help + "; default " + number(arg.default) + ", " + number(arg.minimum) + "–" + number(arg.maximum) + " (" + arg.kind + ")";
      list.append(dt, dd);
    }
    if (batchInput) batchInput.placeholder = String(spec.default_batch_size);
  }

  if (workloadSelect) workloadSelect.addEventListener("change", showArguments);
  showArguments();

  const radios = document.querySelectorAll('#job-form [name="source"]');
  for (const radio of radios) {
    radio.addEventListener("change", () => show(radio.value));
  }
  const checked = document.querySelector('#job-form [name="source"]:checked');
  show(checked ? checked.value : "builtin");
})();
