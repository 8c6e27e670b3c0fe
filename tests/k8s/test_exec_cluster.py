"""Commands in a running job's pod (``Runtime.exec``: the job page's terminal, ``caldera exec``, ``caldera ssh``)
through the pods' exec API on the real test cluster, from the platform's websocket down.

kwok runs no containers; what it can serve is the fake node's kubelet exec: for a pod that a kwok ``Exec`` object
names, it runs the command on this host (in the object's workDir, with its env). So everything from the platform's
websocket through the runtime, the API server's pods/exec and the kubelet's stream protocol (channels, resize,
exit status) is real here; that the command runs inside the pod's container as its uid is the one part only a real
node can show."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import WebSocketDenialResponse

from caldera.runtime.base import ExecError
from caldera.runtime.kubernetes import exec as pod_exec
from tests.k8s.conftest import put_queue
from tests.runtime.conftest import wait_for
from tests.test_runs import _submit, _until


def _run(ws, first: dict, typed: bytes = b"") -> tuple[bytes, bytes, dict]:
    ws.send_text(json.dumps(first))
    if typed:
        ws.send_bytes(typed)
    ws.send_text(json.dumps({"eof": True}))
    out = {1: b"", 2: b""}
    while True:
        msg = ws.receive()
        if msg.get("bytes"):
            out[msg["bytes"][0]] += msg["bytes"][1:]
        elif msg.get("text"):
            return out[1], out[2], json.loads(msg["text"])
        else:
            raise AssertionError(f"closed without an end message: {msg}")


def test_exec_in_a_running_pod_with_a_terminal_and_only_for_its_owner(k8s_cluster, platform_on_k8s, tmp_path):
    from kubernetes import client

    k = platform_on_k8s
    put_queue(k, k.account)
    alice = k.api.user(k.admin, "alice", accounts=[k.account])
    bob = k.api.user(k.admin, "bob")
    jid = _submit(k.api, alice, name="sh", command=["sleep", "600"], resources={"cpu": 1})
    _until(k.api, alice, jid, {"Running"})
    [pod] = k.runtime.pods.get((jid, "1"))
    name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
    body = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Exec",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"execs": [{"local": {"workDir": str(tmp_path), "envs": [{"name": "IN_POD", "value": name}]}}]},
    }
    client.CustomObjectsApi(k8s_cluster.api_client).create_namespaced_custom_object(
        "kwok.x-k8s.io", "v1alpha1", ns, "execs", body
    )
    url = f"/api/v1/jobs/{jid}/exec"
    # (kwok ends no command's stdin, so none here reads to its end)
    # the user's words are the command list: the "shell string" is one word for sh -c, as the user meant it
    argv = ["sh", "-c", 'echo "out $IN_POD $TERM $(pwd)"; echo err >&2; read line; echo "$line"; exit 3']

    def first_exec() -> tuple[bytes, bytes, dict]:  # kwok learns of its new Exec object by a watch
        with k.api.client.websocket_connect(url, headers=alice) as ws:
            out = _run(ws, {"argv": argv}, typed=b"from stdin\n")
        return out if out[2] != {"exit": 126} else None

    out, err, end = wait_for(first_exec, 30, interval=0.5, what="kwok to serve the pod's exec")
    assert (out, err, end) == (f"out {name} dumb {tmp_path}\nfrom stdin\n".encode(), b"err\n", {"exit": 3})

    # a terminal: one stream, the client's TERM, its size (sent before what is typed), Ctrl-D ends the shell.
    # kwok (v0.8.0, execInContainerWithTTY) closes the pty as soon as the command exits, while its copy of the
    # pty's output may not have caught up, and applies a resize in a goroutine of its own: the command waits a
    # moment before it exits, and a run that lost kwok's race is run again
    def terminal() -> tuple[bytes, bytes, dict] | None:
        with k.api.client.websocket_connect(url, headers=alice) as ws:
            first = {"argv": ["sh", "-c", 'read line; echo "[$TERM $(stty size)]"; sleep 1'], "tty": True}
            got = _run(ws, {**first, "term": "xterm-256color", "rows": 31, "cols": 97}, typed=b"go\n")
        return got if b"[xterm-256color 31 97]" in got[0] else None

    out, err, end = wait_for(terminal, 60, interval=0.5, what="the terminal's output through kwok")
    assert (err, end) == (b"", {"exit": 0}), out

    # bob: the job does not exist for him
    with pytest.raises(WebSocketDenialResponse) as refused, k.api.client.websocket_connect(url, headers=bob):
        pass
    assert refused.value.status_code == 404

    # typed refusals of the runtime: a rank the job lacks, a pod the API server does not know, an ended job
    [handle] = [h for h in k.runtime.attached() if h.job_id == jid]
    with pytest.raises(ExecError) as e:
        k.runtime.exec(handle, 1, ["true"], False)
    assert e.value.reason == "NoSuchRank"
    with pytest.raises(ExecError) as e:
        pod_exec.start(k.runtime.core, ns, "no-such-pod", ["true"], False, "", 30)
    assert e.value.reason == "StartFailed"
    assert k.api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=alice).status_code == 200
    _until(k.api, alice, jid, {"Cancelled"})
    with pytest.raises(ExecError) as e:
        k.runtime.exec(handle, 0, ["true"], False)
    assert e.value.reason == "NotRunning"


@pytest.mark.parametrize(
    "status, expected",
    [
        (b'{"metadata":{},"status":"Success"}', (0, "")),
        # a kubelet's (CRI) non-zero exit: the code as the ExitCode cause
        (
            b'{"status":"Failure","message":"command terminated with non-zero exit code: 2","reason":"NonZeroExitCode",'
            b'"details":{"causes":[{"reason":"ExitCode","message":"2"}]}}',
            (2, ""),
        ),
        # the command never ran: its reason is shown, with the shell's "cannot execute"
        (b'{"status":"Failure","message":"exec: \\"nope\\": executable file not found"}', (126, 'exec: "nope": '
         "executable file not found")),
        (b"", (255, "")),  # the stream ended without a status
    ],
)  # fmt: skip
def test_the_exit_status_of_a_real_kubelets_stream(status, expected):
    assert pod_exec.exit_status(status) == expected
