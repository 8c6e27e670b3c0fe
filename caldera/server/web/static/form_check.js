// Checks a form as one types: the form's data-check URL answers with the errors its submit would meet, by field
// name, in the reader's language (the server's own rules: no rule is repeated here). Only the fields the user has
// changed are marked; the form's other errors go to its live region. The submit checks everything again.
"use strict";
(function () {
  for (const form of document.querySelectorAll("form[data-check]")) {
    const touched = new Set();
    const summary = form.querySelector(".form-check-summary");
    let timer = null;
    let asked = 0;
    function place(control) {
      return control.closest(".field") || control.closest("fieldset") || form;
    }
    function show(errors) {
      for (const old of form.querySelectorAll(".field-err.live")) old.remove();
      for (const c of form.elements) {
        if (!c.name) continue;
        const mine = touched.has(c.name) ? errors[c.name] || [] : [];
        if (mine.length) c.setAttribute("aria-invalid", "true");
        else c.removeAttribute("aria-invalid");
        c.classList.toggle("is-invalid", mine.length > 0);
      }
      for (const name of touched) {
        const control = form.elements[name];
        const first = control && (control.length !== undefined && !control.tagName ? control[0] : control);
        if (!first || !errors[name]) continue;
        const where = place(first);
        for (const text of errors[name]) {
          const span = document.createElement("span");
          span.className = "field-err live";
          span.dataset.field = name;
          span.textContent = text;
          where.appendChild(span);
        }
      }
      if (summary) summary.textContent = (errors[""] || []).join(" ");
    }
    async function check() {
      const n = ++asked;
      const r = await fetch(form.dataset.check, {
        method: "POST", body: new URLSearchParams(new FormData(form)), credentials: "same-origin",
      });
      if (!r.ok || n !== asked) return; // a newer check is on its way
      show((await r.json()).errors || {});
    }
    function changed(event) {
      if (!event.target.name) return;
      touched.add(event.target.name);
      clearTimeout(timer);
      timer = setTimeout(check, 300);
    }
    form.addEventListener("input", changed);
    form.addEventListener("change", changed);
  }
})();
