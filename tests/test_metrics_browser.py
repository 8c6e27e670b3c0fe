"""The metrics views in a real browser, end to end: `caldera up` (its node agent and Debian's real Prometheus) runs a
job that loads a fake GPU; its series reach Prometheus and are drawn on its job page, the cluster page, the idle
page and the node page (admins), in English and Chinese, without tripping the Content-Security-Policy. Screenshots
of each view go to test-output/metrics/ (git-ignored)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from caldera.metrics.query import Prometheus
from caldera.server.web.render import STATIC
from tests.conftest import ServerProcess, free_port, kill_job_processes, server_env, traversable, wait_for
from tests.test_browser import browser  # noqa: F401 - the chromium fixture
from tests.test_portal_browser import _login, signed_in_page
from tests.test_portal_design import AXE, LOCALES, SERIOUS, _context
from tests.test_server_process import token, until

# axe over the page's own content (the top bar's buttons are the layout's, checked by the design test)
SERIOUS_IN_MAIN = SERIOUS.replace("axe.run(document,", "axe.run(document.querySelector('main'),")

pytestmark = [
    pytest.mark.parametrize("db_url", ["sqlite"], indirect=True),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed"),
]
SHOTS = Path(__file__).resolve().parents[1] / "test-output" / "metrics"
LOAD = """sh -c 'echo "{\\"utilisation\\": 75, \\"memory_mib\\": 2048}" > gpu_load.json; sleep 300'"""


@pytest.fixture
def metered(tmp_path, db_url):
    """`caldera up` on the process runtime, its agent sampling every second into the Prometheus it starts."""
    env = server_env(tmp_path, db_url)
    prometheus_port = free_port()
    env.update(
        CALDERA_RUNTIME="local",
        CALDERA_METRICS_INTERVAL_S="1",
        CALDERA_METRICS_PORT=str(free_port()),
        CALDERA_PROMETHEUS_PORT=str(prometheus_port),
    )
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env)
    srv.start()
    yield srv, Prometheus(f"http://127.0.0.1:{prometheus_port}")
    srv.stop()
    kill_job_processes(srv.data_dir)


def _drawn(page, section: str) -> None:
    """Scrolls to the view (its charts load once in sight) and waits until they are drawn; fails with the reason the
    page shows if they are not."""
    page.locator(section).scroll_into_view_if_needed()
    page.wait_for_selector(f"{section}[data-loaded=true], {section}[data-unavailable=true]", timeout=30_000)
    assert page.get_attribute(section, "data-loaded") == "true", page.inner_text(f"{section} .metrics-missing")


def _shot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_a_job_loading_a_fake_gpu_is_drawn_on_every_view(metered, browser):  # noqa: F811
    assert (STATIC / "vendor" / "echarts.min.js").exists(), "no ECharts: run scripts/build-web (needs npm)"
    server, prom = metered
    admin = token(server)
    r = httpx.post(server.url + "/api/v1/users", json={"username": "alice", "password": "password-123"}, headers=admin)
    assert r.status_code == 201, r.text
    alice = token(server, "alice", "password-123")
    r = httpx.post(
        server.url + "/api/v1/jobs", json={"name": "load", "command": LOAD, "resources": {"gpu": 1}}, headers=alice
    )
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    until(server, alice, jid, {"Running"})
    # in the real Prometheus, as the agent reported it
    wait_for(
        lambda: [u for u in prom.job_gpu_utilisation(60) if u.job == jid and u.mean_percent == 75 and u.samples >= 3],
        60,
        what="the job's GPU series in Prometheus",
    )

    page, violations = signed_in_page(browser, server, "alice", "password-123")
    page.goto(f"{server.url}/jobs/{jid}")
    _drawn(page, "#job-metrics")
    for kind in ("job-gpu", "job-gpu-memory", "job-cpu", "job-memory"):
        assert page.get_attribute(f"[data-chart={kind}]", "data-drawn") == "1", kind
    assert page.locator("#job-metrics canvas").count() == 4
    _shot(page, "job")

    page.goto(server.url + "/cluster?since=1h")
    _drawn(page, "#cluster-metrics")
    assert page.get_attribute("[data-chart=cluster-gpus]", "data-drawn") == "5"  # one model: in all, held, ...
    assert jid in page.inner_text("#idle-holders")
    wait = page.inner_text("#queue-waits tbody tr").split("\t")
    assert wait[0] == "default" and wait[1] == "0" and wait[3] == "1"  # nothing waits; the job started
    _shot(page, "cluster")

    page.goto(server.url + "/idle")
    held = page.inner_text(f"#held-now tr[data-job='{jid}'] .utilisation")
    assert 50 <= int(held.removesuffix(" %")) <= 75  # a mean of 10 minutes: its first samples may precede the load
    _shot(page, "idle")
    assert page.goto(server.url + "/admin/nodes/node-0/metrics").status == 403
    assert violations == []

    boss, boss_violations = signed_in_page(browser, server, "admin", "admin-password")
    boss.goto(server.url + "/admin/nodes")
    boss.click("a[href='/admin/nodes/node-0/metrics']")
    _drawn(boss, "#node-metrics")
    assert boss.get_attribute("[data-chart=node-gpu]", "data-drawn") == "2"  # the server's two fake GPUs
    assert jid in boss.inner_text("#node-holders") and "alice" in boss.inner_text("#node-holders")
    _shot(boss, "node")
    boss.goto(server.url + "/low-utilisation?since=7d&by=user")  # the low-utilisation list: idle stacked on used
    _drawn(boss, "#low-utilisation-chart")
    assert boss.get_attribute("[data-chart=idle-gpu-hours]", "data-drawn") == "2"
    assert boss.locator("#low-utilisation tr[data-key=alice]").count() == 1
    _shot(boss, "low-utilisation")
    assert boss_violations == []

    zh = browser.new_context(locale="zh-CN").new_page()
    zh.goto(server.url + "/login")
    zh.fill("input[name=username]", "alice")
    zh.fill("input[name=password]", "password-123")
    zh.click("button[type=submit]")
    zh.wait_for_load_state()
    zh.goto(f"{server.url}/jobs/{jid}")
    _drawn(zh, "#job-metrics")
    assert "GPU 利用率" in zh.get_attribute("[data-chart=job-gpu]", "data-title")
    assert json.loads(zh.get_attribute("#job-metrics", "data-states"))["Running"] == "运行中"  # the events' names
    _shot(zh, "job-zh")
    zh.goto(server.url + "/cluster?since=1h")
    _drawn(zh, "#cluster-metrics")
    assert "集群" in zh.inner_text("h1")
    _shot(zh, "cluster-zh")
    httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=alice)


def test_without_prometheus_the_pages_say_why_and_pass_axe_on_a_phone(tmp_path, db_url, browser):  # noqa: F811
    env = server_env(tmp_path, db_url)
    nobody = f"http://127.0.0.1:{free_port()}"
    env.update(CALDERA_RUNTIME="local", CALDERA_METRICS_PORT=str(free_port()), CALDERA_PROMETHEUS_URL=nobody)
    server = ServerProcess(traversable(tmp_path) / "data", free_port(), env).start()
    try:
        admin = token(server)
        jid = httpx.post(server.url + "/api/v1/jobs", json={"name": "x", "command": "true"}, headers=admin).json()["id"]
        page, violations = signed_in_page(browser, server, "admin", "admin-password")
        page.goto(server.url + "/cluster")
        page.wait_for_selector("#cluster-metrics[data-unavailable=true]", timeout=30_000)
        assert "No metrics:" in page.inner_text(".metrics-missing") and nobody in page.inner_text(".metrics-missing")
        _shot(page, "cluster-unavailable")
        page.goto(server.url + "/idle")
        assert "No metrics:" in page.inner_text("#held-missing")
        assert violations == []
        # the pages of this change, as the portal's design test checks every page: axe, and no sideways scroll
        axe = AXE.read_text()
        for lang in LOCALES:
            for size in ("desktop", "phone"):
                view = _context(browser, lang, "dark", size).new_page()
                _login(view, server, "admin", "admin-password")
                view.wait_for_url(server.url + "/")
                for path in ("/cluster", "/idle", "/admin/nodes/node-0/metrics", f"/jobs/{jid}"):
                    assert view.goto(server.url + path).status == 200
                    if path != "/idle":  # charts load once in sight
                        view.locator("[data-metrics]").scroll_into_view_if_needed()
                    view.wait_for_selector("[data-unavailable=true], #held-missing", timeout=30_000)
                    wide = view.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                    assert wide <= 0, (path, lang, size, wide)
                    if size == "desktop":  # as the design test: the rules do not depend on the width
                        view.evaluate(axe)  # evaluated by the test driver: the page's CSP stays as it is
                        assert view.evaluate(SERIOUS_IN_MAIN) == [], (path, lang)
                view.context.close()
    finally:
        server.stop()
