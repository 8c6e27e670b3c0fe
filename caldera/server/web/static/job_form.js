// Offer only the GPU models and counts the selected queue allows (the server checks again on submit).
"use strict";
(function () {
  const queue = document.getElementById("queue");
  const models = document.getElementById("gpu_model");
  const gpus = document.getElementById("gpu");
  if (!queue || !models || !gpus) return;
  function restrict() {
    const opt = queue.selectedOptions[0];
    if (!opt) return;
    const allowed = new Set(opt.dataset.models ? opt.dataset.models.split(",") : []);
    const max = Number(opt.dataset.maxGpu || 0);
    for (const o of models.options) o.disabled = o.value !== "" && !allowed.has(o.value);
    for (const o of gpus.options) o.disabled = Number(o.value) > max;
    if (models.selectedOptions[0] && models.selectedOptions[0].disabled) models.value = "";
    if (gpus.selectedOptions[0] && gpus.selectedOptions[0].disabled) gpus.value = "0";
  }
  queue.addEventListener("change", restrict);
  restrict();
})();
