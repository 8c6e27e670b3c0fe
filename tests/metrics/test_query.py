"""The PromQL client against real HTTP servers that misbehave: one that hangs, one that answers garbage, one that
is not there. Each fails with MetricsUnavailable inside the time box; a good answer is read."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from caldera.metrics.query import MetricsUnavailable, Prometheus


def _server(handler_body):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            handler_body(self)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def serve():
    servers = []

    def start(body):
        servers.append(_server(body))
        return f"http://127.0.0.1:{servers[-1].server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()


def _reply(handler, payload: bytes) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


def test_a_prometheus_that_hangs_fails_within_the_time_box(serve):
    url = serve(lambda h: time.sleep(3))  # longer than the time box, short enough to end with the test
    started = time.monotonic()
    with pytest.raises(MetricsUnavailable, match="timed out"):
        Prometheus(url, timeout_s=0.5).job_gpu_utilisation(300)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    "payload",
    [
        b"<html>oops</html>",
        b'{"status": "error", "error": "bad query"}',
        b'{"status": "success", "data": {"result": "nope"}}',
        b'{"status": "success", "data": {"result": [{"metric": {"job": "j"}, "value": ["x"]}]}}',
        b'{"status": "success", "data": {"result": [{"metric": {"job": "j"}, "value": [1, "abc"]}]}}',
        b"[]",
    ],
)
def test_a_prometheus_that_answers_garbage_is_unavailable(serve, payload):
    url = serve(lambda h: _reply(h, payload))
    with pytest.raises(MetricsUnavailable):
        Prometheus(url, timeout_s=2).job_gpu_utilisation(300)


def test_a_prometheus_that_is_down_is_unavailable():
    with pytest.raises(MetricsUnavailable, match="refused"):
        Prometheus("http://127.0.0.1:9", timeout_s=1).instant("up")


def test_job_gpu_utilisation_reads_means_and_sample_counts(serve):
    queries = []

    def answer(h):
        query = parse_qs(urlsplit(h.path).query)
        queries.append(query)
        value = "42.5" if query["query"][0].startswith("avg_over_time") else "12"
        result = [{"metric": {"job": "j1", "node": "n1", "gpu": "0"}, "value": [1000, value]}]
        _reply(h, json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode())

    (u,) = Prometheus(serve(answer)).job_gpu_utilisation(3600, at=1000)
    assert (u.job, u.node, u.gpu, u.mean_percent, u.samples) == ("j1", "n1", "0", 42.5, 12)
    assert queries[0]["query"] == ["avg_over_time(caldera_job_gpu_utilisation_percent[3600s])"]
    assert queries[0]["time"] == ["1000"]
