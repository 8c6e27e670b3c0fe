// Follow a job's log without reloading: read new bytes from the API's log endpoint (the session cookie
// authenticates it) from the offset reached so far, once a second, until the job has ended and nothing is left.
"use strict";
(function () {
  const log = document.getElementById("log");
  const rankSelect = document.getElementById("rank");
  const download = document.getElementById("log-download");
  const status = document.getElementById("log-status");
  if (!log) return;
  const job = log.dataset.job;
  const TERMINAL = new Set(["Succeeded", "Failed", "Cancelled", "Lost"]);
  let rank = 0, offset = 0, decoder = new TextDecoder(), generation = 0, timer = null;

  async function state() {
    const r = await fetch(`/api/v1/jobs/${encodeURIComponent(job)}`, { credentials: "same-origin" });
    return r.ok ? (await r.json()).state : null;
  }

  async function tick(gen) {
    if (gen !== generation) return;
    let got = 0;
    const ended = TERMINAL.has(await state());  // read the state first: a log read after it is complete
    try {
      const url = `/api/v1/jobs/${encodeURIComponent(job)}/logs?rank=${rank}&offset=${offset}`;
      const r = await fetch(url, { credentials: "same-origin" });
      if (gen !== generation) return;
      if (r.status === 409) {
        status.textContent = log.dataset.waiting;
      } else if (r.ok) {
        const buf = await r.arrayBuffer();
        got = buf.byteLength;
        if (got) {
          const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
          offset += got;
          log.textContent += decoder.decode(buf, { stream: true });
          if (atBottom) log.scrollTop = log.scrollHeight;
        }
        status.textContent = "";
      }
    } catch (e) {
      // a network hiccup: try again on the next tick
    }
    if (ended && got === 0) {
      log.dataset.done = "true";
      return;
    }
    timer = setTimeout(() => tick(gen), got ? 200 : 1000);
  }

  function start() {
    generation += 1;
    clearTimeout(timer);
    offset = 0;
    decoder = new TextDecoder();
    log.textContent = "";
    delete log.dataset.done;
    if (download) download.href = `/api/v1/jobs/${encodeURIComponent(job)}/logs?rank=${rank}`;
    tick(generation);
  }

  if (rankSelect) rankSelect.addEventListener("change", () => { rank = Number(rankSelect.value); start(); });
  start();
})();
