"""A job that waits because its queue's model-less GPU quota (a total over models, issue 23) is used up says so in
every view, though on Kubernetes it waits in Starting (Kueue admits): /why carries the code KueueGpuTotalUsedUp
with the queue's quota, its use and what the job needs (from the Workload and its ClusterQueue), and ``caldera
why``, the portal's job page and home render it, in English and in Chinese. Before, the reason was Kueue's own
"insufficient unused quota for caldera.io/gpu-total in flavor caldera-default", in English on every page."""

from __future__ import annotations

from fastapi.testclient import TestClient
from markupsafe import escape
from typer.testing import CliRunner

from caldera import client as cli_client
from caldera.cli.main import app as cli
from caldera.runtime.kubernetes import kueue
from caldera.server.web import i18n
from tests.k8s.conftest import put_queue
from tests.portal import browser_for
from tests.runtime.conftest import wait_for
from tests.test_portal_reasons_i18n import EN, ZH
from tests.test_runs import _submit, _until


def test_a_job_short_of_the_gpu_total_says_so_in_every_view(k8s_cluster, platform_on_k8s, monkeypatch):
    k = platform_on_k8s
    c = k.api.client
    queue = f"{k.account}-q"
    put_queue(k, queue, {"gpu": {"guarantee": 4, "capability": 4}})  # gpu=4:4:4, no model named
    alice = k.api.user(k.admin, "alice", accounts=[k.account])
    first = _submit(
        k.api, alice, name="a100s", queue=queue, command=["sleep", "600"], resources={"gpu": 4, "gpu_model": "a100"}
    )
    _until(k.api, alice, first, {"Running"})
    # another model: no per-model quota stops it, only the total
    second = _submit(
        k.api, alice, name="h100s", queue=queue, command=["sleep", "600"], resources={"gpu": 2, "gpu_model": "h100"}
    )

    def total_reason():
        k.tick()
        why = c.get(f"/api/v1/jobs/{second}/why", headers=alice).json()
        reason = next((r for r in why["pending"] if r["code"] == kueue.KUEUE_GPU_TOTAL_USED_UP), None)
        # the queue's use comes from a ClusterQueue watch, which may lag Kueue's verdict by a moment
        return reason if reason and reason["details"].get("in_use") == 4 else None

    reason = wait_for(total_reason, 60, what="the GPU total's reason in /why")
    assert c.get(f"/api/v1/jobs/{second}", headers=alice).json()["state"] == "Starting"  # waiting in Kueue
    details = reason["details"]
    assert (details["quota"], details["in_use"], details["needed"]) == (4, 4, 2), details
    assert details["resources"] == [kueue.GPU_TOTAL_RESOURCE]  # Kueue's own words kept in the details
    english = "the queue's GPU quota, a total over every GPU model, is used up (4 of 4 GPUs in use)"
    english += ": this job needs 2 more GPUs"
    assert reason["message"] == english
    assert EN.pending(reason) == english
    chinese = "队列的 GPU 配额（所有 GPU 型号合计）已用完（已用 4 个，共 4 个）：此作业还需 2 个 GPU"
    assert ZH.pending(reason) == chinese

    # the CLI, through the same API
    token = alice["Authorization"].removeprefix("Bearer ")
    user_client = cli_client.Client("http://testserver", token)
    user_client.http = TestClient(c.app, headers=alice)
    monkeypatch.setattr(cli_client.Client, "from_config", classmethod(lambda cls: user_client))
    out = CliRunner().invoke(cli, ["why", second], terminal_width=400)
    assert out.exit_code == 0, out.output
    assert kueue.KUEUE_GPU_TOTAL_USED_UP in out.output and english in " ".join(out.output.split()), out.output

    # the portal: the job page and home, in each language
    zh, en = browser_for(c, "alice", "password-123"), browser_for(c, "alice", "password-123")
    zh.cookies.set(i18n.LANG_COOKIE, "zh")
    en.cookies.set(i18n.LANG_COOKIE, "en")
    for browser, text in ((zh, chinese), (en, english)):
        for path in (f"/jobs/{second}", "/", "/partials/my-jobs"):
            page = browser.get(path).text
            assert str(escape(text)) in page, path
    assert "caldera.io/gpu-total" not in zh.get(f"/jobs/{second}").text

    for jid in (first, second):
        assert c.post(f"/api/v1/jobs/{jid}/cancel", headers=alice).status_code == 200
        _until(k.api, alice, jid, {"Cancelled"})
