// Follow a log without reloading: a job's (per rank) or an image build's. Every <pre class="log" data-stream=URL>
// opens that server-sent event stream (the session cookie authenticates it), which brings the subject's state
// whenever it changes and its log as it grows; EventSource reconnects by itself and the server resumes from the
// last event id, and an "end" event closes it once the log is complete. Optional: data-rank (id of a rank
// <select>), data-download (id of a download link, pointed at data-log), data-status (ids of elements that show
// data-waiting until there is a log and, with data-show-state, the state as it changes and the final message).
// Each state change is also a "log-state" event on <body>, for htmx blocks that refresh on it.
"use strict";
(function () {
  function follow(log) {
    const statusEls = (log.dataset.status || "").split(" ").map((id) => document.getElementById(id)).filter(Boolean);
    const rankSelect = log.dataset.rank && document.getElementById(log.dataset.rank);
    const download = log.dataset.download && document.getElementById(log.dataset.download);
    let source = null;

    function url(base) {
      const u = new URL(base, location.href);
      if (rankSelect) u.searchParams.set("rank", rankSelect.value);
      return u.pathname + u.search;
    }

    function show(now, ended) {
      let text = "";
      if (!now.started) text = log.dataset.waiting || "";
      else if ("showState" in log.dataset) text = now.state + (ended && now.message ? ": " + now.message : "");
      for (const el of statusEls) el.textContent = text;
      document.body.dispatchEvent(new CustomEvent("log-state"));
    }

    function append(text) {
      const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.textContent += text;
      if (atBottom) log.scrollTop = log.scrollHeight;
    }

    function start() {
      if (source) source.close();
      log.textContent = "";
      delete log.dataset.done;
      if (download && log.dataset.log) download.href = url(log.dataset.log);
      source = new EventSource(url(log.dataset.stream));
      source.addEventListener("log", (e) => append(JSON.parse(e.data)));
      source.addEventListener("attempt", () => { log.textContent = ""; });
      source.addEventListener("state", (e) => show(JSON.parse(e.data), false));
      source.addEventListener("end", (e) => {
        source.close();
        const now = JSON.parse(e.data);
        show({ ...now, started: true }, true);
        log.dataset.finalState = now.state;
        log.dataset.done = "true";
      });
    }

    if (rankSelect) rankSelect.addEventListener("change", start);
    start();
  }

  document.querySelectorAll("pre.log[data-stream]").forEach(follow);
})();
