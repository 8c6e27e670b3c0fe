// Follow a log without reloading: a job's (per rank) or an image build's. Every <pre class="log" data-log=URL>
// reads new bytes from the API's log endpoint (the session cookie authenticates it) from the offset reached so
// far, every 200 ms while output flows and once a second when idle, until its state URL (data-state) reads one of
// the states in data-ended and nothing is left. Optional: data-rank (id of a rank <select>), data-download (id of a
// download link), data-status (ids of elements that show data-waiting while the log endpoint answers 409, not
// started yet, and with data-show-state the state as it changes and the final one with its message).
"use strict";
(function () {
  function follow(log) {
    const ended = new Set(log.dataset.ended.split(" "));
    const statusEls = (log.dataset.status || "").split(" ").map((id) => document.getElementById(id)).filter(Boolean);
    const rankSelect = log.dataset.rank && document.getElementById(log.dataset.rank);
    const download = log.dataset.download && document.getElementById(log.dataset.download);
    let offset = 0, decoder = new TextDecoder(), generation = 0, timer = null;

    function logUrl(withOffset) {
      const url = new URL(log.dataset.log, location.href);
      if (rankSelect) url.searchParams.set("rank", rankSelect.value);
      if (withOffset) url.searchParams.set("offset", String(offset));
      return url.pathname + url.search;
    }

    async function state() {
      const r = await fetch(log.dataset.state, { credentials: "same-origin" });
      return r.ok ? await r.json() : {};
    }

    function show(text) {
      for (const el of statusEls) el.textContent = text;
    }

    async function tick(gen) {
      if (gen !== generation) return;
      let got = 0;
      const now = await state();  // read the state first: a log read after it has ended is complete
      const done = ended.has(now.state);
      try {
        const r = await fetch(logUrl(true), { credentials: "same-origin" });
        if (gen !== generation) return;
        if (r.status === 409) {
          show(log.dataset.waiting || "");
        } else if (r.ok) {
          const buf = await r.arrayBuffer();
          got = buf.byteLength;
          if (got) {
            const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
            offset += got;
            log.textContent += decoder.decode(buf, { stream: true });
            if (atBottom) log.scrollTop = log.scrollHeight;
          }
          const final = done && now.message ? ": " + now.message : "";
          show("showState" in log.dataset && now.state ? now.state + final : "");
        }
      } catch (e) {
        // a network hiccup: try again on the next tick
      }
      if (done && got === 0) {
        log.dataset.done = "true";
        log.dataset.finalState = now.state;
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
      if (download) download.href = logUrl(false);
      tick(generation);
    }

    if (rankSelect) rankSelect.addEventListener("change", start);
    start();
  }

  document.querySelectorAll("pre.log[data-log]").forEach(follow);
})();
