"""The web portal under load, in a real browser: the home page of a user with 1,000 jobs, and how long a line a job
prints takes to appear on its page.

    python benchmarks/bench_portal.py [--jobs 1000] [--runs 15]

Starts `caldera up` (2 fake A100s) in a temporary directory, submits ``jobs`` GPU jobs that stay queued (the queue's
GPU capability is 0, so every cycle explains each of them), then measures with httpx the time to first byte of the
home page (median and max of ``runs``), and with Debian's chromium (Playwright) the navigation timings of the home
page: response start, DOM interactive, load event; the same for a job's page and the paged lists of my jobs and of
all jobs; and the page weight: the stylesheets, scripts and fonts the home page loads, each gzip-compressed (-9) as
a compressing proxy or server would send them, against the 300 KB budget. Then a job prints its clock every 200 ms
for 10 s and the browser records when each line appears in the job page's log (a MutationObserver): the log-follow
latency, median and p95.
Needs chromium (/usr/bin/chromium) and playwright; the benchmark's browser context bypasses the page's CSP only to
install its observer. Exits 0.
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import ServerProcess, free_port, kill_job_processes, traversable  # noqa: E402

OBSERVE = """() => {
  window.__seen = [];
  const log = document.getElementById("log");
  new MutationObserver(() => {
    const now = Date.now() / 1000;
    for (const line of log.textContent.split("\\n")) {
      const t = parseFloat(line.split(" ")[1]);
      if (line.startsWith("tick ") && !window.__seen.some(s => s[0] === t)) window.__seen.push([t, now]);
    }
  }).observe(log, {childList: true, characterData: true, subtree: true});
}"""
TICKER = "python3 -u -c \"import time; [(print('tick', time.time()), time.sleep(0.2)) for _ in range(50)]\""


def _server(tmp: Path) -> ServerProcess:
    env = {
        **os.environ,
        "CALDERA_INITIAL_ADMIN_PASSWORD": "admin-password",
        "CALDERA_SCHEDULE_INTERVAL_S": "1",
        "CALDERA_RUN_JOBS_AS": "owner" if os.geteuid() == 0 else "server",
        "CALDERA_DATABASE_URL": f"sqlite:///{tmp / 'caldera.db'}",
        "CALDERA_NODE_NAME": "node-0",
    }
    return ServerProcess(traversable(tmp) / "data", free_port(), env).start()


def _browser_login(context, url: str):
    page = context.new_page()
    page.goto(url + "/login")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "admin-password")
    page.click("button[type=submit]")
    page.wait_for_url(url + "/")
    return page


def _print_timings(what: str, nav: list[dict]) -> None:
    for key in ("responseStart", "domInteractive", "loadEventEnd"):
        ms = [n[key] - n["startTime"] for n in nav]
        print(f"{what} in chromium, {key}: median {statistics.median(ms):.0f} ms, max {max(ms):.0f} ms")


def _print_weight(page, url: str) -> None:
    """What the page loaded besides itself (stylesheets, scripts, fonts), compressed; fonts are woff2, compressed
    already, and count as they are."""
    names = page.evaluate("() => performance.getEntriesByType('resource').map(r => r.name)")
    total = 0
    for name in sorted(set(names)):
        body = httpx.get(name).content
        size = len(body) if name.split("?")[0].endswith(".woff2") else len(gzip.compress(body, 9))
        total += size
        print(f"  {name.removeprefix(url)}: {len(body) / 1024:.0f} KB, {size / 1024:.0f} KB compressed")
    print(f"page weight (CSS, JS, fonts), compressed: {total / 1024:.0f} KB (budget 300 KB)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="caldera-bench-portal-") as tmp:
        srv = _server(Path(tmp))
        try:
            with httpx.Client(base_url=srv.url, timeout=60) as api:
                pair = api.post("/api/v1/auth/login", json={"username": "admin", "password": "admin-password"})
                auth = {"Authorization": f"Bearer {pair.json()['access_token']}"}
                api.headers.update(auth)
                # a cordoned node: every job is accepted and waits, and each cycle explains why
                r = api.post("/api/v1/admin/nodes/node-0/cordon", json={"reason": "benchmark: jobs wait"})
                assert r.status_code == 200, r.text
                t0 = time.perf_counter()
                for i in range(args.jobs):
                    job = {"name": f"j{i}", "command": "true", "resources": {"gpu": 1}}
                    r = api.post("/api/v1/jobs", json=job)
                    assert r.status_code == 201, r.text
                print(f"submitted {args.jobs} jobs in {time.perf_counter() - t0:.1f} s")
                time.sleep(3)  # a few cycles: every job has its pending reasons

                ttfb = []
                for _ in range(args.runs):
                    t = time.perf_counter()
                    with api.stream("GET", "/") as r:
                        next(r.iter_raw())
                        ttfb.append((time.perf_counter() - t) * 1000)
                        assert r.status_code == 200
                print(f"home, time to first byte: median {statistics.median(ttfb):.0f} ms, max {max(ttfb):.0f} ms")

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
                context = browser.new_context(bypass_csp=True)
                page = _browser_login(context, srv.url)
                nav = []
                for _ in range(args.runs):
                    page.goto(srv.url + "/")
                    nav.append(page.evaluate("() => performance.getEntriesByType('navigation')[0].toJSON()"))
                _print_timings("home", nav)
                _print_weight(page, srv.url)
                a_job = httpx.get(f"{srv.url}/api/v1/jobs?limit=1", headers=auth).json()[0]["id"]
                lists = {"job page": f"/jobs/{a_job}", "my jobs, page 10 by name": "/jobs?sort=name&page=10",
                         "all jobs, 200 a page": "/admin/jobs?size=200"}  # fmt: skip
                for what, path in lists.items():
                    nav = []
                    for _ in range(args.runs):
                        page.goto(srv.url + path)
                        nav.append(page.evaluate("() => performance.getEntriesByType('navigation')[0].toJSON()"))
                    _print_timings(what, nav)

                # the log-follow job must run: lift the cordon, and cancel the waiting jobs ahead of it
                httpx.post(f"{srv.url}/api/v1/admin/nodes/node-0/uncordon", headers=auth).raise_for_status()
                for j in httpx.get(f"{srv.url}/api/v1/jobs?limit=5000", headers=auth, timeout=60).json():
                    httpx.post(f"{srv.url}/api/v1/jobs/{j['id']}/cancel", headers=auth, timeout=60)
                page.goto(srv.url + "/new/batch")
                page.fill("input[name=name]", "ticker")
                page.fill("input[name=command]", TICKER)
                page.select_option("select[name=gpu]", "0")
                page.click("#submit")
                page.wait_for_url("**/jobs/*")
                page.evaluate(OBSERVE)
                page.wait_for_selector("#log[data-done=true]", timeout=120_000)
                seen = page.evaluate("() => window.__seen")
                assert seen, page.inner_text("#log")
                lat = sorted((now - printed) * 1000 for printed, now in seen)
                p95 = lat[int(0.95 * (len(lat) - 1))]
                print(f"log follow ({len(lat)} lines): median {statistics.median(lat):.0f} ms, p95 {p95:.0f} ms")
                browser.close()
        finally:
            srv.stop()
            kill_job_processes(srv.data_dir)


if __name__ == "__main__":
    main()
