// The metrics views' charts (ECharts, static/vendor/echarts.min.js, about 235 KB compressed: loaded only once a view
// with data comes into sight, so the job page weighs no more until one scrolls to its charts). The page names what
// to draw in data attributes, the numbers come from the API's JSON (the session cookie authenticates the fetch):
//   <section data-metrics=URL data-missing=TEXT>   where the charts of one view read from; TEXT is shown, with the
//                                                 API's reason, when Prometheus gave nothing
//   <div class="chart" data-chart=KIND data-title=TITLE data-names=JSON>   one chart (KIND: see DRAW and BARS)
//   <tbody data-table=KIND>                       rows filled from the answer (KIND: see ROWS below)
// Each chart element gets data-drawn="N" (its number of series) once drawn, for the browser tests.
"use strict";
(function () {
  const GIB = 1024 * 1024 * 1024;

  function points(pts, scale) {
    return pts.map(([t, v]) => [t * 1000, v === null ? null : v / (scale || 1)]);
  }

  function line(name, pts, scale) {
    // a series of a point or two (a job that just started, on a day's chart) shows its points: a line needs more
    const few = pts.filter(([, v]) => v !== null).length < 3;
    return { name: name, type: "line", showSymbol: few, connectNulls: false, data: points(pts, scale) };
  }

  function gpuName(s, names) {
    const where = s.node + " · GPU " + s.gpu;
    return s.replica === null || s.replica === undefined ? where : names.replica + " " + s.replica + " · " + where;
  }

  // chart kind -> series from the view's answer; names: the element's data-names (translated words)
  const DRAW = {
    "job-gpu": (d, n) => d.gpu_utilisation.map((s) => line(gpuName(s, n), s.points)),
    "job-gpu-memory": (d, n) => d.gpu_memory_bytes.map((s) => line(gpuName(s, n), s.points, GIB)),
    "job-cpu": (d) => d.cpu_cores.map((s) => line(s.node, s.points)),
    "job-memory": (d) => d.memory_bytes.map((s) => line(s.node, s.points, GIB)),
    "cluster-gpus": (d, n) =>
      d.models.flatMap((m) =>
        ["total", "allocated", "computing", "idle", "down"].map((k) => line(m.model + " " + n[k], m[k]))),
    "cluster-utilisation": (d, n) => ["all", "allocated"].map((k) => line(n[k], d.utilisation[k])),
    "cluster-queues": (d) => d.queues.map((q) => line(q.queue, q.waiting)),
    "cluster-queue-waits": (d) => d.queues.map((q) => line(q.queue, q.oldest_wait_s, 60)),
    "node-gpu": (d) => d.gpus.map((g) => line("GPU " + g.gpu, g.utilisation)),
    "node-memory": (d) => d.gpus.map((g) => line("GPU " + g.gpu, g.memory_used_bytes, GIB)),
  };

  // bar chart kind -> {categories, series}: totals per name (not over time)
  const BARS = {
    "idle-gpu-hours": (d, n) => {
      const key = d.by;
      return {
        categories: d.rows.map((r) => r[key]),
        series: [["idle", "idle_gpu_hours"], ["used", "used_gpu_hours"]].map(([k, field]) => ({
          name: n[k], type: "bar", stack: "hours", data: d.rows.map((r) => r[field]),
        })),
      };
    },
  };

  function cell(row, text, href) {
    const td = row.insertCell();
    if (href) {
      const a = document.createElement("a");
      a.href = href;
      a.textContent = text;
      td.appendChild(a);
    } else {
      td.textContent = text;
    }
  }

  function last(pts) {
    const known = pts.filter(([, v]) => v !== null);
    return known.length ? known[known.length - 1][1] : null;
  }

  function duration(s) {
    // seconds as "42 s", "7 min", "3.5 h": a wait read at a glance
    if (s === null || s === undefined) return "–";
    if (s < 120) return Math.round(s) + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  function when(t) {
    return new Date(t * 1000).toLocaleString();
  }

  // table kind -> rows of cells [text, link]
  const ROWS = {
    "idle-holders": (d) => d.idle_holders.map((h) => [
      [h.job, "/jobs/" + encodeURIComponent(h.job)], [h.user], [h.queue], [String(h.gpus)], [h.mean_percent.toFixed(1) + " %"],
    ]),
    "queue-waits": (d) => d.queues.map((q) => [
      [q.queue], [String(last(q.waiting) ?? "–")], [duration(last(q.oldest_wait_s))], [String(q.started)],
      [duration(q.wait_s["0.5"])], [duration(q.wait_s["0.9"])], [duration(q.wait_s["0.99"])],
    ]),
    "node-holders": (d) => d.holders.map((h) => [
      [h.gpu], [h.job, "/jobs/" + encodeURIComponent(h.job)], [h.user], [when(h.from)], [when(h.to)],
    ]),
  };

  function events(d, states) {
    // a job's events as vertical lines on its charts' time axis, named by the state they led to (data-states: the
    // states in the page's language)
    return (d.events || []).filter((e) => e.at >= d.start && e.at <= d.end).map((e) => ({
      xAxis: e.at * 1000, label: { formatter: states[e.to] || e.to, position: "insideEndTop" },
    }));
  }

  function drawBars(el, d, names) {
    const bars = BARS[el.dataset.chart](d, names);
    const chart = echarts.init(el, null, { renderer: "canvas" });
    chart.setOption({
      animation: false,
      title: { text: el.dataset.title, textStyle: { fontSize: 14 } },
      tooltip: { trigger: "axis" },
      legend: { bottom: 0 },
      grid: { top: 40, left: 50, right: 20, bottom: 56 },
      xAxis: { type: "category", data: bars.categories, axisLabel: { hideOverlap: true } },
      yAxis: { type: "value", min: 0 },
      series: bars.series,
    });
    window.addEventListener("resize", () => chart.resize());
    el.dataset.drawn = String(bars.series.length);
  }

  function draw(el, d, states) {
    const names = el.dataset.names ? JSON.parse(el.dataset.names) : {};
    if (BARS[el.dataset.chart]) return drawBars(el, d, names);
    const series = DRAW[el.dataset.chart](d, names);
    const marks = events(d, states);
    if (marks.length && series.length) {
      series[0].markLine = { symbol: "none", silent: true, lineStyle: { type: "dashed" }, data: marks };
    }
    const chart = echarts.init(el, null, { renderer: "canvas" });
    chart.setOption({
      animation: false,
      title: { text: el.dataset.title, textStyle: { fontSize: 14 } },
      tooltip: { trigger: "axis" },
      legend: { type: "scroll", bottom: 0 },
      grid: { top: 40, left: 50, right: 20, bottom: 56 },
      xAxis: { type: "time", min: d.start * 1000, max: d.end * 1000, axisLabel: { hideOverlap: true } },
      yAxis: { type: "value", min: 0, max: el.dataset.max ? Number(el.dataset.max) : null },
      series: series,
    });
    window.addEventListener("resize", () => chart.resize());
    el.dataset.drawn = String(series.length);
  }

  function fill(body, d) {
    body.replaceChildren();
    for (const cells of ROWS[body.dataset.table](d)) {
      const row = body.insertRow();
      for (const [text, href] of cells) cell(row, text, href);
    }
    body.dataset.drawn = String(body.rows.length);
  }

  function missing(view, reason) {
    const note = view.querySelector(".metrics-missing");
    note.textContent = view.dataset.missing + " " + reason;
    note.hidden = false;
    view.dataset.unavailable = "true";
  }

  let library = null;

  function charting() {
    if (window.echarts) return Promise.resolve();
    library = library || new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = "/static/vendor/echarts.min.js";
      script.onload = resolve;
      script.onerror = () => reject(new Error("no charting library (scripts/build-web)"));
      document.head.appendChild(script);
    });
    return library;
  }

  function show(view) {
    fetch(view.dataset.metrics, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => r.ok ? r.json() : Promise.reject(new Error(r.status + " " + r.statusText)))
      .then((d) => d.available ? charting().then(() => d) : d)
      .then((d) => {
        if (!d.available) return missing(view, d.reason);
        const states = view.dataset.states ? JSON.parse(view.dataset.states) : {};
        view.querySelectorAll("[data-chart]").forEach((el) => draw(el, d, states));
        view.querySelectorAll("[data-table]").forEach((body) => fill(body, d));
        view.dataset.loaded = "true";
      })
      .catch((e) => missing(view, String(e.message || e)));
  }

  document.addEventListener("DOMContentLoaded", () => {
    const sight = new IntersectionObserver((entries) => {
      for (const e of entries.filter((e) => e.isIntersecting)) {
        sight.unobserve(e.target);
        show(e.target);
      }
    });
    document.querySelectorAll("[data-metrics]").forEach((view) => sight.observe(view));
  });
})();
