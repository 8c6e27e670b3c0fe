"""The home page's cards show my running jobs' GPU utilisation from Prometheus (a stub Prometheus over real HTTP,
as tests/metrics/test_query.py has): the mean of each job's GPUs over the last minute, nothing of others' jobs; and
when Prometheus is not there or hangs, the page still answers at once and says there is no figure."""

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from caldera.db.models import Job
from caldera.server.web import gpu_use
from tests.portal import browser_for

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def stub_prometheus():
    """A Prometheus that answers ``answers[job][gpu]`` as each GPU's mean (or hangs), and records the queries."""
    state = {"answers": {}, "queries": [], "hang": False}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            query = parse_qs(urlsplit(self.path).query)["query"][0]
            state["queries"].append(query)
            if state["hang"]:
                time.sleep(3)  # past the page's time box; the page has gone, nothing to answer
                return
            counting = query.startswith("count_over_time")
            result = [
                {"metric": {"job": job, "node": "node-0", "gpu": gpu}, "value": [time.time(), "6" if counting else v]}
                for job, gpus in state["answers"].items()
                for gpu, v in gpus.items()
            ]
            body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()


def _running(api, platform, headers, name, gpu) -> str:
    body = {"name": name, "command": "sleep 600", "resources": {"gpu": gpu}}
    jid = api.client.post("/api/v1/jobs", json=body, headers=headers).json()["id"]
    with platform.session() as db:  # as the loop leaves it once launched: what the page reads
        db.get(Job, jid).state = "Running"
        db.commit()
    return jid


def _card(html: str, jid: str) -> str:
    return re.search(rf'<article class="job-card" data-job="{jid}">(.*?)</article>', html, re.S).group(1)


def test_home_cards_show_my_running_jobs_gpu_utilisation(api, admin, platform, stub_prometheus, monkeypatch):
    platform.settings.prometheus_url = stub_prometheus["url"]
    monkeypatch.setattr(gpu_use, "TIMEOUT_S", 10)  # the figures, not the time box (tested below): a loaded CI is slow
    me = browser_for(api.client, "admin", "admin-password")
    assert "gpu-use" not in me.get("/").text and stub_prometheus["queries"] == []  # nothing running: no query
    busy = _running(api, platform, admin, "busy", 2)
    quiet = _running(api, platform, admin, "quiet", 1)
    others = _running(api, platform, api.user(admin, "bob"), "bobs", 1)
    stub_prometheus["answers"] = {busy: {"0": "73.5", "1": "26.5"}, others: {"2": "99"}}
    html = me.get("/").text
    card = _card(html, busy)
    assert "2 GPUs</span>" in card  # the job's GPUs (the spec's, as the all-jobs list counts them)
    assert '<progress class="usage-bar" max="100" value="50"' in card and "<span>50%</span>" in card  # both GPUs
    assert "no samples yet" in _card(html, quiet)
    assert "99%" not in html and 'value="99"' not in html  # bob's job's figure (not "99": a job id may hold it)
    assert any("caldera_job_gpu_utilisation_percent[60s]" in q for q in stub_prometheus["queries"])
    zh = me.get("/", headers={"Accept-Language": "zh"}).text
    assert "GPU 利用率（最近一分钟）" in _card(zh, busy)


def test_without_prometheus_the_home_page_says_so_at_once(api, admin, platform, stub_prometheus):
    me = browser_for(api.client, "admin", "admin-password")
    _running(api, platform, admin, "busy", 1)
    platform.settings.prometheus_url = "http://127.0.0.1:9"  # nothing listens
    r = me.get("/")
    assert r.status_code == 200 and 'id="gpu-use-unavailable"' in r.text and "Prometheus did not answer" in r.text
    platform.settings.prometheus_url = stub_prometheus["url"]
    stub_prometheus["hang"] = True
    started = time.monotonic()
    r = me.get("/")
    assert r.status_code == 200 and 'id="gpu-use-unavailable"' in r.text
    assert time.monotonic() - started < gpu_use.TIMEOUT_S + 1.5  # the page's own time box, not Prometheus' 3 s
    assert "没有应答" in me.get("/", headers={"Accept-Language": "zh"}).text
