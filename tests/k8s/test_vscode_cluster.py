"""A vscode job on the real test cluster, reached through its lab origin as labs on Kubernetes are
(tests/k8s/test_lab_cluster.py): kwok runs no container, so a small HTTP server of the test stands in for
code-server at the pod's IP and lab port, letting in only the session cookie equal to its HASHED_PASSWORD (what
code-server 4.x does with a HASHED_PASSWORD: it compares the cookie with it). The proxy must log in with the lab
Secret's token as that cookie, cut it out of pages, never pass on a cookie of the browser's, and refuse others."""

from __future__ import annotations

import base64

from tests.conftest import free_port
from tests.k8s.conftest import StandIn, put_queue
from tests.runtime.conftest import wait_for
from tests.test_runs import _submit, _until

SESSION = "code-server-session"


def _code_server(hashed_password: str):
    """Answers as code-server given HASHED_PASSWORD: to the session cookie equal to it the workbench (which shows
    it, as a page may show what it was given), to anything else the way to its login page."""

    def answer(path: str, headers) -> tuple[int, dict[str, str], bytes]:
        if f"{SESSION}={hashed_password}" not in (headers.get("Cookie") or "").split("; "):
            return 302, {"Location": "/login"}, b""
        return 200, {"Content-Type": "text/html"}, f"<html>workbench {path} {hashed_password}</html>".encode()

    return answer


def test_vscode_is_code_server_at_its_pod_reached_with_the_secrets_cookie(k8s_cluster, platform_on_k8s, make_rt):
    from fastapi.testclient import TestClient
    from kubernetes import client

    from caldera.server.lab_app import create_lab_app

    k = platform_on_k8s
    k.runtime.ks = k.runtime.ks.model_copy(update={"lab_port": free_port()})  # the stand-in's, on this shared host
    put_queue(k, k.account)
    alice = k.api.user(k.admin, "alice", accounts=[k.account])
    bob = k.api.user(k.admin, "bob")
    jid = _submit(k.api, alice, name="ide", kind="vscode", env={"PASSWORD": "chosen-by-alice"})
    _until(k.api, alice, jid, {"Running"})
    [pod] = k.runtime.pods.get((jid, "1"))
    container = pod["spec"]["containers"][0]
    assert container["command"][:2] == ["code-server", f"--bind-addr=0.0.0.0:{k.runtime.ks.lab_port}"]
    job = k.runtime.jobs.get((jid, "1"))[0]["metadata"]
    secret = f"{job['name']}-lab"
    env = {e["name"]: e for e in container["env"]}
    assert env["HASHED_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": "token"}
    assert "PASSWORD" not in env  # the job's own would be code-server's password
    read = client.CoreV1Api(k8s_cluster.api_client).read_namespaced_secret(secret, job["namespace"])
    token = base64.b64decode(read.data["token"]).decode()

    ide = StandIn(pod["status"]["podIP"], k.runtime.ks.lab_port, _code_server(token)).start()
    platform = k.api.client.app.state.platform
    try:
        with TestClient(create_lab_app(platform), base_url=platform.settings.lab_url(jid)) as origin:
            assert origin.get("/").status_code == 401  # no credentials: nothing reaches the pod
            # alice's token, and a session cookie of her browser's own that must not go upstream
            r = origin.get("/manifest.json", headers={**alice, "Cookie": f"{SESSION}=forged"})
            assert r.status_code == 200 and r.text == "<html>workbench /manifest.json </html>"  # token cut out
            assert origin.get("/", headers=bob).status_code == 404  # not his job
        [seen] = ide.seen
        assert (seen["path"], seen["cookie"]) == ("/manifest.json", f"{SESSION}={token}")
    finally:
        ide.stop()
    # after a server restart the job is found again with the way into it
    again = make_rt(k8s={"lab_port": k.runtime.ks.lab_port})
    [handle] = wait_for(lambda: [h for h in again.attached() if h.job_id == jid], 30, what="re-attach")
    assert (handle.data["secret"], handle.data["base_url"]) == (secret, "/")
    [endpoint] = wait_for(lambda: again.endpoints(handle), 30, what="the endpoint after the restart")
    assert (endpoint.host, endpoint.base_url) == (pod["status"]["podIP"], "/")
    assert endpoint.headers == {"Cookie": f"{SESSION}={token}"} and endpoint.secrets == (token,)
    assert k.api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=alice).status_code == 200
    _until(k.api, alice, jid, {"Cancelled"})
