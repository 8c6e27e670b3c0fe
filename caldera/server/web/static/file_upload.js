// The file browser's uploads, through the API's resumable uploads (docs/storage.md): declare the path and size,
// send chunks with Upload-Offset, and after a broken chunk ask where the platform's copy ends and go on from there.
// Files come from the file field or are dropped on the form. The page reloads to list them when all are in.
"use strict";
(function () {
  const form = document.getElementById("upload");
  if (!form) return;
  const input = document.getElementById("upload-files");
  const bar = document.getElementById("upload-progress");
  const status = document.getElementById("upload-status");
  const api = "/api/v1/spaces/" + encodeURIComponent(form.dataset.space) + "/uploads";
  const chunk = Number(form.dataset.chunk);
  const TRIES = 5;
  function say(template, values) {
    status.textContent = template.replace(/%\((\w+)\)s/g, (_, k) => values[k]);
  }
  async function reason(r) {
    try {
      return (await r.json()).detail || r.statusText;
    } catch (e) {
      return r.statusText;
    }
  }
  async function send(file) {
    const path = form.dataset.path ? form.dataset.path + "/" + file.name : file.name;
    const r = await fetch(api, {
      method: "POST", credentials: "same-origin", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({path: path, size: file.size}),
    });
    if (!r.ok) throw new Error(await reason(r));
    const upload = await r.json();
    let offset = 0;
    let tries = 0;
    while (!upload.done && offset < file.size) {
      const at = api + "/" + upload.id;
      let r2;
      try {
        r2 = await fetch(at, {
          method: "PATCH", credentials: "same-origin",
          headers: {"Upload-Offset": String(offset), "Content-Type": "application/offset+octet-stream"},
          body: file.slice(offset, offset + chunk),
        });
      } catch (e) {
        r2 = null; // the connection broke: ask where the platform's copy ends
      }
      if (r2 && r2.ok) {
        const body = await r2.json();
        offset = body.offset;
        upload.done = body.done;
        bar.value = offset / Math.max(file.size, 1);
        continue;
      }
      if (r2 && r2.status !== 409 && r2.status < 500) throw new Error(await reason(r2));
      if (++tries > TRIES) throw new Error(r2 ? await reason(r2) : "network");
      const where = await fetch(at, {credentials: "same-origin"});
      if (!where.ok) throw new Error(await reason(where));
      offset = (await where.json()).offset;
    }
  }
  async function uploadAll(files) {
    if (!files.length) return;
    bar.hidden = false;
    for (const file of files) {
      bar.value = 0;
      try {
        await send(file);
        say(form.dataset.done, {name: file.name});
      } catch (e) {
        say(form.dataset.failed, {name: file.name, reason: e.message});
        return;
      }
    }
    window.location.reload();
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    uploadAll(Array.from(input.files));
  });
  form.addEventListener("dragover", (event) => {
    event.preventDefault();
    form.classList.add("dropping");
  });
  form.addEventListener("dragleave", () => form.classList.remove("dropping"));
  form.addEventListener("drop", (event) => {
    event.preventDefault();
    form.classList.remove("dropping");
    uploadAll(Array.from(event.dataTransfer.files));
  });
})();
