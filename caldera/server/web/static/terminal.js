// A shell in a running job of mine, in the job page: xterm.js over the platform's websocket
// /api/v1/jobs/<id>/exec (see caldera/server/api_exec.py). The session cookie authenticates it; the browser names
// this page's Origin, and the first message carries the page's CSRF token (data-csrf). The rank is the one the
// log's rank <select> (data-rank) shows; the terminal follows the box's size; the server ends the session when the
// job ends. Messages come translated from the page (#terminal-messages). The page's CSP admits no inline style
// but the nonce in data-style-nonce: xterm.js styles itself with <style> elements, which get it here.
"use strict";
(function () {
  const box = document.getElementById("terminal");
  const button = document.getElementById("terminal-open");
  if (!box || !button || !window.Terminal) return;
  const status = document.getElementById(box.dataset.status);
  const messages = JSON.parse(document.getElementById("terminal-messages").textContent);
  const rankSelect = box.dataset.rank && document.getElementById(box.dataset.rank);
  const shell = ["/bin/sh", "-c", "if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi"];
  const encoder = new TextEncoder();
  const nonce = box.dataset.styleNonce;
  const createElement = document.createElement.bind(document);
  document.createElement = function (tag, options) {
    const el = createElement(tag, options);
    if (nonce && String(tag).toLowerCase() === "style") el.nonce = nonce;
    return el;
  };
  let socket = null;
  let term = null;
  let fit = null;

  function say(text) {
    status.textContent = text;
  }

  function send(data) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(data);
  }

  function make() {
    term = new window.Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000 });
    fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    term.onData((text) => send(encoder.encode(text)));
    term.onBinary((text) => send(Uint8Array.from(text, (c) => c.charCodeAt(0))));
    term.onResize(({ rows, cols }) => send(JSON.stringify({ resize: [rows, cols] })));
    new ResizeObserver(() => fit.fit()).observe(box);
  }

  function open() {
    if (socket) socket.close();
    box.hidden = false;
    if (!term) make();
    term.reset();
    fit.fit();
    const rank = rankSelect ? Number(rankSelect.value) : 0;
    const url = new URL(box.dataset.exec, location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(url);
    socket = ws;
    ws.binaryType = "arraybuffer";
    let ended = false;
    ws.onopen = () => {
      ws.send(JSON.stringify({
        argv: shell, rank, tty: true, rows: term.rows, cols: term.cols, term: "xterm-256color", csrf: box.dataset.csrf,
      }));
      say(messages.connected.replace("%(rank)s", rank));
      term.focus();
    };
    ws.onmessage = (event) => {
      if (typeof event.data !== "string") {
        term.write(new Uint8Array(event.data, 1));
        return;
      }
      const end = JSON.parse(event.data);
      ended = true;
      say("exit" in end ? messages.exited.replace("%(code)s", end.exit) : messages[end.error] || end.message);
    };
    ws.onclose = () => {
      if (!ended && socket === ws) say(messages.closed);
      if (socket === ws) socket = null;
    };
  }

  button.addEventListener("click", open);
})();
