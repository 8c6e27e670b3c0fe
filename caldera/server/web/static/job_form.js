// The job form's helpers (the server checks everything again on submit): offer only the GPU models and counts the
// selected queue allows, show the largest request that starts now in it, fill resources from a preset. The checks
// as one types are form_check.js's.
"use strict";
(function () {
  const queue = document.getElementById("queue");
  const models = document.getElementById("gpu_model");
  const gpus = document.getElementById("gpu");
  if (!queue || !models || !gpus) return;
  const largest = document.getElementById("largest-now-n");
  const presets = document.querySelectorAll("#presets .preset");
  function restrict() {
    const opt = queue.selectedOptions[0];
    if (!opt) return;
    const allowed = new Set(opt.dataset.models ? opt.dataset.models.split(",") : []);
    const max = Number(opt.dataset.maxGpu || 0);
    for (const o of models.options) o.disabled = o.value !== "" && !allowed.has(o.value);
    for (const o of gpus.options) o.disabled = Number(o.value) > max;
    for (const b of presets) b.disabled = Number(b.dataset.gpu) > max;
    if (models.selectedOptions[0] && models.selectedOptions[0].disabled) models.value = "";
    if (gpus.selectedOptions[0] && gpus.selectedOptions[0].disabled) gpus.value = "0";
    if (largest) largest.textContent = opt.dataset.largestNow || "0";
  }
  for (const b of presets) {
    b.addEventListener("click", () => {
      gpus.value = b.dataset.gpu;
      document.getElementById("cpu").value = b.dataset.cpu;
      document.getElementById("memory_mib").value = b.dataset.memory;
      gpus.dispatchEvent(new Event("change", {bubbles: true})); // checked like a choice of one's own
    });
  }
  queue.addEventListener("change", restrict);
  restrict();
})();
