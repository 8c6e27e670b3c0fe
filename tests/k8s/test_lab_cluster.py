"""A jupyter job on the real test cluster, reached through the platform's lab origin as a browser and a script reach
it: kwok gives the pod an IP on loopback (scripts/k8s/cluster.py POD_CIDR) but runs no container, so a small HTTP
server the test starts at the pod's IP and lab port stands in for Jupyter there. The proxy must find the pod, log in
with the lab's token (a header the browser never sees), and refuse someone else."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from tests.conftest import free_port
from tests.k8s.conftest import StandIn, put_queue
from tests.test_runs import _submit, _until


def _lab(token: str):
    """Answers as a lab would that wants its token: 403 without it; its page carries the token, as Lab's does."""

    def answer(path: str, headers) -> tuple[int, dict[str, str], bytes]:
        ok = headers.get("Authorization") == f"token {token}"
        body = f"<html>lab page {path} token={token}</html>".encode() if ok else b"no token"
        return (200 if ok else 403), {"Content-Type": "text/html"}, body

    return answer


def test_jupyter_is_reached_at_its_pod_through_the_lab_origin_and_another_user_is_refused(k8s_cluster, platform_on_k8s):
    import base64

    from fastapi.testclient import TestClient
    from kubernetes import client

    from caldera.server.lab_app import create_lab_app

    k = platform_on_k8s
    # a lab port of this test's own: the stand-in binds it at the pod's IP on this shared host
    k.runtime.ks = k.runtime.ks.model_copy(update={"lab_port": free_port()})
    put_queue(k, k.account)
    alice = k.api.user(k.admin, "alice", accounts=[k.account])
    bob = k.api.user(k.admin, "bob")
    jid = _submit(k.api, alice, name="lab", kind="jupyter", resources={"gpu": 1})
    _until(k.api, alice, jid, {"Running"})
    [pod] = k.runtime.pods.get((jid, "1"))
    pod_ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(pod_ip).is_loopback and pod_ip != "127.0.0.1"  # the pod's own, from kwok's CIDR
    job = k.runtime.jobs.get((jid, "1"))[0]["metadata"]
    secret = client.CoreV1Api(k8s_cluster.api_client).read_namespaced_secret(f"{job['name']}-lab", job["namespace"])
    token = base64.b64decode(secret.data["token"]).decode()

    lab = StandIn(pod_ip, k.runtime.ks.lab_port, _lab(token)).start()
    platform = k.api.client.app.state.platform
    try:
        with TestClient(create_lab_app(platform), base_url=platform.settings.lab_url(jid)) as origin:
            base = f"/jobs/{jid}/lab"
            # no credentials: nothing reaches the pod
            assert origin.get(f"{base}/api/status").status_code == 401
            # a script with alice's API token
            r = origin.get(f"{base}/api/status", headers=alice)
            assert r.status_code == 200 and r.text == f"<html>lab page {base}/api/status token=</html>"  # scrubbed
            # a browser: the platform's origin hands out a one-use ticket, the lab origin turns it into a cookie
            r = k.api.client.get(f"{base}/lab", headers=alice, follow_redirects=False)
            assert r.status_code == 303
            assert r.headers["location"].startswith(f"{platform.settings.lab_url(jid)}/_caldera/")
            entry = urlsplit(r.headers["location"])
            r = origin.get(f"{entry.path}?{entry.query}", follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"] == f"{base}/lab"
            assert origin.get(f"{base}/lab", headers={"Accept": "text/html"}).status_code == 200
            assert origin.get(f"{entry.path}?{entry.query}", follow_redirects=False).status_code == 401  # spent
            origin.cookies.clear()
            # bob: the job does not exist for him, by token or by ticket
            assert origin.get(f"{base}/api/status", headers=bob).status_code == 404
            assert k.api.client.get(f"{base}/lab", headers=bob, follow_redirects=False).status_code == 404
        upstream = [s for s in lab.seen if s["path"].startswith(base)]
        assert [s["path"] for s in upstream] == [f"{base}/api/status", f"{base}/lab"]  # only alice's two got there
        for s in upstream:  # logged in by the proxy with the lab's token; the caller's credentials stay behind
            assert s["authorization"] == f"token {token}" and "caldera_lab" not in s.get("cookie", "")
    finally:
        lab.stop()
    assert k.api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=alice).status_code == 200
    _until(k.api, alice, jid, {"Cancelled"})
