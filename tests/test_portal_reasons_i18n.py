"""What the platform says about jobs reads in the page's language: states, kinds, priorities, job events, the
scheduler's pending reasons and the API's field errors, on real jobs (real processes, real scheduling cycles, a real
drain and preemption). A zh page holds no English sentence from these sources; an en page no Chinese."""

import re
from html import unescape

import pytest
from markupsafe import escape

from caldera.db.models import Job, JobEventRow
from caldera.server.web import i18n
from caldera.server.web.reason_text import ERRORS, EVENTS, PENDING, SHAPES, Say
from tests.portal import browser_for, field_errors, post_form
from tests.test_runs import _submit, _until

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

CJK = re.compile(r"[\u4e00-\u9fff]")
PLACEHOLDER = re.compile(r"%\((\w+)\)s")
ZH = Say(i18n.translations("zh").gettext)
EN = Say(str)


def _messages():
    for table in (PENDING, EVENTS, ERRORS):
        for message in table.values():
            yield message.msgid
            yield from (msgid for _, msgid in message.clauses)
    yield from (msgid for _, msgid in SHAPES)


def _english_fragments() -> set[str]:
    """The fixed English words of every catalogue message: the text between its placeholders, where it is long
    enough to be a phrase and not a value."""
    out = set()
    for msgid in _messages():
        for part in PLACEHOLDER.split(msgid)[::2]:
            part = part.strip(" ,;:()")
            if len(part) >= 10 and " " in part:
                out.add(part)
    return out


def test_every_message_has_a_chinese_text_with_the_same_placeholders():
    zh = i18n.translations("zh")
    for msgid in _messages():
        assert zh.gettext(msgid) != msgid, msgid
        assert set(PLACEHOLDER.findall(zh.gettext(msgid))) == set(PLACEHOLDER.findall(msgid)), msgid


def test_an_unknown_code_or_missing_details_show_the_english_message():
    reason = {"code": "VolcanoPending", "message": "not admitted", "details": {"source": "volcano"}}
    assert ZH.pending(reason) == "not admitted"
    no_values = {"code": "QueuePosition", "message": "position 3 in the queue", "details": {}}
    assert ZH.pending(no_values) == "position 3 in the queue"
    old = JobEventRow(reason="Submitted", message="submitted by ann", details=None)  # stored before details
    assert ZH.event(old) == "submitted by ann"
    new = JobEventRow(reason="Submitted", message="submitted by ann", details={"user": "ann"})
    assert ZH.event(new) == "由 ann 提交" and EN.event(new) == "submitted by ann"
    assert ZH.reason({"field": "x", "reason": "something new"}) == "something new"


def _zh_page_is_chinese(html: str, where: str) -> None:
    found = [f for f in _english_fragments() if str(escape(f)) in html]
    assert not found, f"{where}: English on a zh page: {found}"


def _en_page_is_english(html: str, where: str) -> None:
    assert not CJK.findall(html.replace("中文", "")), f"{where}: Chinese on an en page"  # 中文: the language menu


def _said(platform, job_ids: list[str]) -> tuple[dict[str, Job], dict[str, list[JobEventRow]]]:
    with platform.session() as db:
        jobs = {j: db.get(Job, j) for j in job_ids}
        events = {j: list(db.query(JobEventRow).filter_by(job_id=j).order_by(JobEventRow.id)) for j in job_ids}
        db.expunge_all()
    return jobs, events


def _state_shown(html: str) -> str:
    """The words of the job page's state badge (its icon is decoration)."""
    shown = re.search(r'id="state">(?:<i [^>]*></i>)?([^<]*)</span>', html)
    assert shown, "no state on the job page"
    return shown.group(1)


def _check_job_page(zh_html: str, en_html: str, job: Job, events: list[JobEventRow], reasons: list[dict]) -> None:
    where = f"job {job.name} ({job.state})"
    _zh_page_is_chinese(zh_html, where)
    _en_page_is_english(en_html, where)
    assert _state_shown(zh_html) == escape(ZH.state(job.state)), where
    assert _state_shown(en_html) == job.state, where
    assert str(escape(ZH.kind(job.kind))) in zh_html and str(escape(ZH.priority(job.priority))) in zh_html
    for e in events:
        if e.reason in EVENTS:  # the platform's own reasons are written with their parameters
            assert e.details is not None, (where, e.reason, e.message)
            assert ZH.event(e) != e.message and CJK.search(ZH.event(e)), (where, e.reason)
            assert str(escape(e.message)) not in zh_html, (where, e.message)
        assert str(escape(ZH.event(e))) in zh_html, (where, e.reason)
        assert str(escape(EN.event(e))) in en_html, (where, e.reason)
    if job.state == "Queued":
        assert reasons, where
        for r in reasons:
            assert r["code"] in PENDING, r
            assert str(escape(ZH.pending(r))) in zh_html and str(escape(r["message"])) not in zh_html, r
            assert str(escape(EN.pending(r))) in en_html, r


@SQLITE
def test_job_home_and_queue_pages_in_chinese_and_in_english(api, admin, platform):
    c = api.client
    alice = api.user(admin, "alice")
    ok = _submit(api, alice, name="ok", command=["true"])
    bad = _submit(api, alice, name="bad", command=["sh", "-c", "exit 3"], priority="low")
    long = _submit(api, alice, name="long", command=["sleep", "120"], resources={"gpu": 4})
    _until(api, alice, ok, {"Succeeded"})
    _until(api, alice, bad, {"Failed"})
    _until(api, alice, long, {"Running"})
    waits = _submit(api, alice, name="waits", command=["true"], resources={"gpu": 2}, kind="batch")
    gone = _submit(api, alice, name="gone", command=["true"], resources={"gpu": 2})
    assert c.post(f"/api/v1/jobs/{gone}/cancel", headers=alice).status_code == 200
    c.app.state.loop.tick()
    node = c.get("/api/v1/nodes", headers=admin).json()[0]["name"]
    drained = c.post(f"/api/v1/admin/nodes/{node}/drain", json={"reason": "new fan"}, headers=admin)
    assert drained.json()["preempted"] == [long]
    _until(api, alice, long, {"Queued"})  # preempted, re-queued; the drained node keeps both waiting
    c.app.state.loop.tick()
    ids = [ok, bad, long, waits, gone]

    zh, en = browser_for(c, "alice", "password-123"), browser_for(c, "alice", "password-123")
    zh.cookies.set(i18n.LANG_COOKIE, "zh")
    en.cookies.set(i18n.LANG_COOKIE, "en")

    shown = platform.queue_positions.shown  # the stored reasons with the place in the queue

    def check_all() -> None:
        jobs, events = _said(platform, ids)
        for j in ids:
            _check_job_page(zh.get(f"/jobs/{j}").text, en.get(f"/jobs/{j}").text, jobs[j], events[j], shown(jobs[j]))
        for path in ("/", "/partials/my-jobs", "/queue"):
            _zh_page_is_chinese(zh.get(path).text, path)
            _en_page_is_english(en.get(path).text, path)
        home_zh, home_en = zh.get("/").text, en.get("/").text
        for j in jobs.values():  # the Why column: pending reasons of a waiting job, else its last message
            if j.state == "Queued":
                for r in shown(j):
                    assert str(escape(ZH.pending(r))) in home_zh and str(escape(EN.pending(r))) in home_en
            else:
                last = next(e for e in reversed(events[j.id]) if (e.reason, e.message) == (j.reason, j.message))
                assert str(escape(ZH.event(last))) in home_zh and str(escape(EN.event(last))) in home_en, j.reason
            assert f">{escape(ZH.state(j.state))}</span>" in home_zh

    check_all()
    _, events = _said(platform, [long])
    reasons = [e.reason for e in events[long]]
    for code in ("Submitted", "Admitted", "Scheduled", "Running", "PreemptionRequested", "NodeDrained", "Requeued"):
        assert code in reasons, reasons
    assert "节点 " + node + " 被管理员排空：new fan；现在发送 SIGTERM" in zh.get(f"/jobs/{long}").text

    assert c.post(f"/api/v1/admin/nodes/{node}/uncordon", headers=admin).status_code == 200
    _until(api, alice, long, {"Running"})
    c.app.state.loop.tick()
    check_all()  # attempt 2 running, the 2-GPU job waiting behind it
    assert c.post(f"/api/v1/jobs/{long}/cancel", headers=alice).status_code == 200
    _until(api, alice, long, {"Cancelled"})
    assert c.post(f"/api/v1/jobs/{waits}/cancel", headers=alice).status_code == 200
    check_all()  # CancelRequested, and a job cancelled while it ran
    _, events = _said(platform, [long])
    assert "CancelRequested" in [e.reason for e in events[long]]


@SQLITE
def test_new_job_form_errors_in_chinese_and_in_english(api, admin):
    c = api.client
    api.user(admin, "alice")
    zh, en = browser_for(c, "alice", "password-123"), browser_for(c, "alice", "password-123")
    zh.cookies.set(i18n.LANG_COOKIE, "zh")
    form = {"name": "x", "command": "true", "queue": "default", "gpu": "0", "cpu": "1", "memory_mib": "64"}
    cases = [  # (changed fields, the form field that shows the error, its Chinese, its English)
        ({"queue": "nope"}, "queue", "未知队列 nope", "unknown queue nope"),
        ({"env": "no-equals"}, "env", "'no-equals'：应为 KEY=VALUE 格式", "'no-equals': expected KEY=VALUE"),
        ({"gpu": "99"}, "gpu", "每个副本需要 99 块同型号 GPU，但最大的节点只有 4 块", None),
        ({"name": "bad name!"}, "name", "须符合格式 ", "must match the pattern "),
        ({"cpu": "-1"}, "cpu", "不能小于 0", "must be at least 0"),
        ({"priority": "high"}, "", "优先级 high 需要队列 default 的授权", "priority high needs a grant in queue"),
    ]
    for changed, field, chinese, english in cases:
        r = post_form(zh, "/new/batch", {**form, **changed})
        assert r.status_code == 400, changed
        shown = [unescape(e) for e in field_errors(r.text, field)]
        assert any(e.startswith(chinese) for e in shown), (changed, shown)
        _zh_page_is_chinese(r.text, str(changed))
        r = post_form(en, "/new/batch", {**form, **changed})
        _en_page_is_english(r.text, str(changed))
        shown = [unescape(e) for e in field_errors(r.text, field)]
        assert shown and (english is None or any(e.startswith(english) for e in shown)), (changed, shown)

    r = post_form(zh, "/new/batch", {**form, "command": ""})  # the spec's own rule, shown above the form
    assert "批处理作业需要命令" in field_errors(r.text, "")
    # the API keeps its English for scripts, and adds the code and values of the reasons that are ours
    r = c.post("/api/v1/jobs", json={"name": "x", "command": ["true"], "queue": "nope"}, headers=admin)
    assert r.status_code == 400
    assert r.json()["errors"] == [
        {"field": "queue", "reason": "unknown queue 'nope'", "code": "UnknownQueue", "params": {"queue": "nope"}}
    ]


def test_restart_events_in_chinese(tmp_path, monkeypatch):
    """Re-attached after a restart, then a record the runtime cannot read: unobservable while its processes may
    live, lost once they were found and ended; each event in Chinese with its values (servers as in
    tests/test_restart_runtimes.py, each life a new runtime on the same data directory)."""
    from caldera.runtime.local.runtime import LocalRuntime
    from tests.conftest import make_settings
    from tests.test_restart_runtimes import _server

    settings = make_settings(tmp_path, gpus=1)
    with _server(settings, LocalRuntime(settings)) as (api, admin):
        job_id = _submit(api, admin, name="sleeps", command=["sleep", "120"], resources={"gpu": 1})
        _until(api, admin, job_id, {"Running"})
    with _server(settings, LocalRuntime(settings)) as (api, admin):  # re-attached
        assert api.client.get(f"/api/v1/jobs/{job_id}", headers=admin).json()["state"] == "Running"
        with api.client.app.state.platform.session() as db:  # a record the runtime cannot parse
            job = db.get(Job, job_id)
            job.handle = {**job.handle, "ranks": "not a list"}
            db.commit()
    monkeypatch.setattr(LocalRuntime, "end_attempt", lambda self, job_id, attempt: False)
    with _server(settings, LocalRuntime(settings)):  # unobservable: its processes could not be ended
        pass
    monkeypatch.undo()
    with _server(settings, LocalRuntime(settings)) as (api, admin):  # found and ended: lost
        platform = api.client.app.state.platform
        jobs, events = _said(platform, [job_id])
        assert jobs[job_id].state == "Lost"
        reasons = [e.reason for e in events[job_id]]
        for code in ("Reattached", "Unobservable", "ReattachFailed"):
            assert code in reasons, reasons
        zh, en = browser_for(api.client, "admin", "admin-password"), browser_for(api.client, "admin", "admin-password")
        zh.cookies.set(i18n.LANG_COOKIE, "zh")
        html = zh.get(f"/jobs/{job_id}").text
        shown = platform.queue_positions.shown(jobs[job_id])
        _check_job_page(html, en.get(f"/jobs/{job_id}").text, jobs[job_id], events[job_id], shown)
        assert "服务器已重启；进程仍在运行（local 运行时）" in html and "第 1 次尝试的所有进程均已找到并结束" in html


@SQLITE
def test_a_preemption_by_the_scheduler_in_chinese(api, admin, platform):
    """The scheduler's own preemption (best-effort gives way): the request, the preemption and the re-queue."""
    be = _submit(api, admin, name="be", command=["sleep", "120"], priority="best-effort", resources={"gpu": 4})
    _until(api, admin, be, {"Running"})
    urgent = _submit(api, admin, name="urgent", command=["sleep", "60"], resources={"gpu": 2})
    _until(api, admin, be, {"Queued"})
    _until(api, admin, urgent, {"Running"})
    api.client.app.state.loop.tick()
    zh, en = browser_for(api.client, "admin", "admin-password"), browser_for(api.client, "admin", "admin-password")
    zh.cookies.set(i18n.LANG_COOKIE, "zh")
    jobs, events = _said(platform, [be, urgent])
    for j in (be, urgent):
        shown = platform.queue_positions.shown(jobs[j])
        _check_job_page(zh.get(f"/jobs/{j}").text, en.get(f"/jobs/{j}").text, jobs[j], events[j], shown)
    html = zh.get(f"/jobs/{be}").text
    assert f"为作业 {urgent} 被抢占：尽力而为作业为其他所有作业让路；现在发送 SIGTERM" in html
    assert "抢占后重新排队；工作目录不变" in html and "尽力而为" in html
    for j in (be, urgent):
        api.client.post(f"/api/v1/jobs/{j}/cancel", headers=admin)
        _until(api, admin, j, {"Cancelled"})


def _codes_written_by_the_runtimes() -> set[str]:
    """Every reason code a runtime or the server writes into an event: LaunchError codes and Observation reasons."""
    from pathlib import Path

    import caldera

    root = Path(caldera.__file__).parent
    found: set[str] = set()
    for path in [*root.glob("runtime/**/*.py"), *root.glob("server/*.py")]:
        text = path.read_text()
        found |= set(re.findall(r'LaunchError\(\s*"([A-Za-z]+)"', text))
        found |= set(re.findall(r'\breason="([A-Za-z]+)"', text))
        found |= set(re.findall(r'LaunchError\(\s*\n\s*"([A-Za-z]+)"', text))
        found |= set(re.findall(r'return "([A-Z][A-Za-z]+)", f?"', text))  # (reason, message) of an image check
    return found


def test_every_reason_a_runtime_writes_into_an_event_has_a_chinese_sentence():
    codes = _codes_written_by_the_runtimes()
    assert {"CommandNotFound", "SpawnError", "SupervisorFailed", "JupyterNotInImage"} <= codes, codes
    assert not codes - set(EVENTS) - {"LaunchFailed"}, codes - set(EVENTS)
    assert "LaunchFailed" in EVENTS


def test_cluster_reasons_and_runtime_words_read_in_chinese_with_the_quoted_text_kept():
    quota = {
        "code": "KueueInsufficientQuota",
        "message": "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor a100",
        "details": {"source": "kueue", "flavors": ["a100"], "resources": ["nvidia.com/gpu"]},
    }
    zh = ZH.pending(quota)
    assert zh.startswith("Kueue：其队列目前配额不足（a100 中 nvidia.com/gpu 不足）；Kueue 的原话：couldn't"), zh
    assert EN.pending(quota).startswith("Kueue: not enough quota in its queue now (short of nvidia.com/gpu in a100)")
    held = {"code": "HeldNoNodeFits", "message": "held: ...", "details": {"evictions": 3, "unschedulable": "0/4 nodes"}}
    assert ZH.pending(held).startswith("已暂停：连续被驱逐 3 次") and ZH.pending(held).endswith(
        "kube-scheduler：0/4 nodes"
    )
    for reason, details, expected in (
        ("LaunchFailed", {"error": "no such user"}, "无法启动：no such user"),
        ("CommandNotFound", {"error": "command not found in image x: trian.py"}, "其镜像中没有该命令：command not"),
        ("Evicted", {"detail": "PodsReady timeout"}, "被集群（Kueue）驱逐并重新排队：PodsReady timeout"),
        ("Running", {"detail": "rank 1 failed; stopping the other ranks"}, "所有进程正在运行（rank 1 failed"),
        ("Profiled", {"window_s": 60, "node": "n0", "gpu": 0, "gpu_model": "a100", "cpu": 97},
         "前 60 秒独占 n0 的 GPU 0（a100）时的单独画像；CPU 占一个核的 97%"),
    ):  # fmt: skip
        shown = ZH.event(JobEventRow(reason=reason, message="english", details=details))
        assert shown.startswith(expected), (reason, shown)
        assert not re.search(r"\b(could|its|by the|solo profile)\b", shown.replace(str(details), "")), shown
