"""The pod-log copier without a cluster: a scripted pods/log API that fails, breaks off and ends early, as a kubelet
can. The copier keeps following on its own while the pod runs (no observe() needed to start it again), copies every
byte once, reads a finished pod's log to its end and then stops; a pod that is gone ends its copy."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from caldera.runtime.kubernetes.logcopy import LogCopier
from tests.runtime.conftest import wait_for


class Broken(Exception):
    """The connection to the kubelet broke."""


class _Stream:
    def __init__(self, parts: list, hang: bool):
        self.parts, self.hang, self.closed = parts, hang, threading.Event()

    def stream(self, _chunk: int):
        for part in self.parts:
            if isinstance(part, Exception):
                raise part
            yield part.encode()
        if self.hang:  # a follow that stays open until someone closes it
            self.closed.wait(30)
            raise Broken("closed")

    def close(self) -> None:
        self.closed.set()


class ScriptedLogs:
    """pods/log answers in order (the last one again and again): an exception is a refused request, a list is a
    stream of its strings (an exception in it breaks it off)."""

    def __init__(self, *answers, hang: bool = False):
        self.answers, self.hang, self.calls = list(answers), hang, []

    def read_namespaced_pod_log(self, pod: str, namespace: str, **kw) -> _Stream:
        assert kw["follow"] is True and kw["container"] == "job"
        self.calls.append(time.monotonic())
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return _Stream(answer, self.hang)


def _threads(pod: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"log-{pod}"]


def test_follows_again_through_failures_while_the_pod_runs_and_copies_each_byte_once(tmp_path: Path):
    logs = ScriptedLogs(
        Broken("container not started"),  # not servable yet
        ["hello ", Broken("kubelet restarted")],  # broken off after some bytes
        ["hello ", "wor"],  # ended cleanly though the pod runs on
        ["hello ", "world\n"],  # every follow from now on: the whole log so far
    )
    dest = tmp_path / "rank-0.log"
    copier = LogCopier(logs, backoff_s=0.02, max_backoff_s=0.1)
    copier.ensure("ns", "pod-a", dest, "Running")
    wait_for(lambda: dest.exists() and dest.read_bytes() == b"hello world\n", 10, what="the whole log")
    following = len(logs.calls)
    wait_for(lambda: len(logs.calls) > following + 2, 10, what="more follows while the pod runs")
    copier.pod_changed("ns", "pod-a", "Succeeded")  # the pod ended: one follow reads it to its end, then no more
    wait_for(lambda: not _threads("pod-a"), 10, what="the copy to end")
    calls = len(logs.calls)
    copier.ensure("ns", "pod-a", dest, "Succeeded")  # as observe() asks again
    time.sleep(0.3)
    assert len(logs.calls) == calls and dest.read_bytes() == b"hello world\n"


def test_failures_back_off_up_to_the_cap_and_a_finished_pods_log_is_given_up_after_some_tries(tmp_path: Path):
    logs = ScriptedLogs(Broken("no log here"))
    copier = LogCopier(logs, backoff_s=0.05, max_backoff_s=0.2, finished_tries=3)
    copier.ensure("ns", "pod-b", tmp_path / "b.log", "Running")
    wait_for(lambda: len(logs.calls) >= 6, 10, what="six follows")
    gaps = [b - a for a, b in zip(logs.calls, logs.calls[1:])]
    assert gaps[0] >= 0.09 and all(g >= 0.19 for g in gaps[2:5]), gaps  # 0.1, 0.2 (the cap), 0.2, ...
    assert _threads("pod-b")  # a running pod is followed on, however long it fails
    copier.pod_changed("ns", "pod-b", "Failed")
    wait_for(lambda: not _threads("pod-b"), 10, what="the copy of the finished pod to give up")
    calls = len(logs.calls)
    time.sleep(0.5)
    assert len(logs.calls) == calls


def test_a_pod_that_is_gone_ends_its_copy(tmp_path: Path):
    hanging = ScriptedLogs(["started\n"], hang=True)
    copier = LogCopier(hanging, backoff_s=0.02)
    copier.ensure("ns", "pod-c", tmp_path / "c.log", "Running")
    wait_for(lambda: (tmp_path / "c.log").exists() and (tmp_path / "c.log").read_bytes() == b"started\n", 10)
    copier.forget("ns", "pod-c")  # its DELETED event: the open follow is closed
    wait_for(lambda: not _threads("pod-c"), 10, what="the forgotten pod's copy to end")
    # deleted while the watch was relisting (no DELETED event): the next failure asks the cache, and stops
    present = {"pod-d": True}
    failing = ScriptedLogs(Broken("pod not found"))
    copier = LogCopier(failing, exists=lambda ns, pod: present[pod], backoff_s=0.02, max_backoff_s=0.02)
    copier.ensure("ns", "pod-d", tmp_path / "d.log", "Running")
    wait_for(lambda: len(failing.calls) >= 3, 10, what="follows of a pod that still exists")
    present["pod-d"] = False
    wait_for(lambda: not _threads("pod-d"), 10, what="the vanished pod's copy to end")


def test_close_ends_every_copy_and_waits_for_its_thread(tmp_path: Path):
    hanging = ScriptedLogs(["started\n"], hang=True)  # a follow open inside a read
    failing = ScriptedLogs(Broken("not yet"))  # a copy waiting out its backoff
    copier = LogCopier(hanging, backoff_s=0.02)
    copier.ensure("ns", "pod-e", tmp_path / "e.log", "Running")
    wait_for(lambda: (tmp_path / "e.log").exists() and (tmp_path / "e.log").read_bytes() == b"started\n", 10)
    other = LogCopier(failing, backoff_s=30, max_backoff_s=30)
    other.ensure("ns", "pod-f", tmp_path / "f.log", "Running")
    wait_for(lambda: failing.calls, 10, what="a first, failed follow")
    for c in (copier, other):
        c.close()
    assert not _threads("pod-e") and not _threads("pod-f")  # gone when close returns, not some time later
