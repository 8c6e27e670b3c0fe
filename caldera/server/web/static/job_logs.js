// Follow a job without reloading: one server-sent event stream (the session cookie authenticates it) brings the
// job's state whenever it changes and the chosen rank's log as it grows. EventSource reconnects by itself and the
// server resumes the log from the last event id; the stream ends with an "end" event once the log is complete.
"use strict";
(function () {
  const log = document.getElementById("log");
  const rankSelect = document.getElementById("rank");
  const download = document.getElementById("log-download");
  const status = document.getElementById("log-status");
  if (!log) return;
  const job = encodeURIComponent(log.dataset.job);
  const STARTED = new Set(["Starting", "Running", "Succeeded", "Failed", "Cancelled", "Lost"]);
  let source = null;

  function stateChanged() {
    // the status block (htmx) refreshes on this event instead of waiting for its next poll
    document.body.dispatchEvent(new CustomEvent("job-state"));
  }

  function append(text) {
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.textContent += text;
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  function follow(rank) {
    if (source) source.close();
    log.textContent = "";
    delete log.dataset.done;
    if (download) download.href = `/api/v1/jobs/${job}/logs?rank=${rank}`;
    source = new EventSource(`/api/v1/jobs/${job}/stream?rank=${rank}`);
    source.addEventListener("log", (e) => append(JSON.parse(e.data)));
    source.addEventListener("attempt", () => { log.textContent = ""; });
    source.addEventListener("state", (e) => {
      status.textContent = STARTED.has(JSON.parse(e.data).state) ? "" : log.dataset.waiting;
      stateChanged();
    });
    source.addEventListener("end", () => {
      source.close();
      log.dataset.done = "true";
      stateChanged();
    });
  }

  if (rankSelect) rankSelect.addEventListener("change", () => follow(Number(rankSelect.value)));
  follow(0);
})();
