"""The queue view through the real app and a real scheduling cycle: the jobs ahead of mine in the scheduler's
order, others' without private detail, and my fair-share standing from the stored usage."""

import re
import time

import pytest

from caldera.db.models import Usage
from tests.portal import browser_for

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _submit(api, headers, name, **kw) -> str:
    body = {"name": name, "command": "echo TOPSECRET", "env": {"TOKEN": "hunter2"}, "resources": {"gpu": 2}, **kw}
    r = api.client.post("/api/v1/jobs", json=body, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _rows(html: str, queue: str) -> list[list[str]]:
    table = re.search(rf'<table class="waiting" data-queue="{queue}">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    return [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)
    ]


def test_jobs_ahead_of_mine_without_their_detail_and_my_fair_share(api, admin, platform):
    bob_h, alice_h = api.user(admin, "bob"), api.user(admin, "alice")
    bob1, bob2 = _submit(api, bob_h, "bob-secret-1"), _submit(api, bob_h, "bob-secret-2")
    mine = _submit(api, alice_h, "alice-train", resources={"gpu": 2, "gpu_model": "a100"})
    _submit(api, bob_h, "bob-secret-3")
    capped = {"account": "default", "user_caps": {"max_gpus": 1}}  # after the submissions, which it would refuse
    assert api.client.put("/api/v1/queues/default", json=capped, headers=admin).status_code == 200
    with platform.session() as db:  # alice ran 2 GPU-hours recently
        db.add(Usage(key="user:alice", value=7200.0, updated_at=time.time()))
        db.commit()
    api.client.app.state.loop.tick()

    alice = browser_for(api.client, "alice", "password-123")
    html = alice.get("/queue").text
    rows = _rows(html, "default")
    # submitted third, but her recent usage puts her behind all of bob's (fair share, no usage for him)
    assert [r[:4] for r in rows] == [[str(i), "bob", "2", "any"] for i in (1, 2, 3)] + [["4", "alice", "2", "a100"]]
    assert re.fullmatch(r"\d+s", rows[0][4]) and rows[0][5] == "" and rows[3][5] == "alice-train"
    assert f'href="/jobs/{mine}"' in html
    for private in ("bob-secret", "TOPSECRET", "hunter2", bob1, bob2):  # no name, command, env or id of others
        assert private not in html
    standing = re.search(r'<table id="fair-share">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    assert re.findall(r"<td>([^<]*)</td>", standing)[:3] == ["default", "0.00", "2.00"]  # 2 users, all usage hers
    assert "2.00 GPU-hours" in html

    bob_page = browser_for(api.client, "bob", "password-123").get("/queue").text
    assert [r[:2] for r in _rows(bob_page, "default")] == [["1", "bob"], ["2", "bob"], ["3", "bob"]]  # up to his last
    assert "0.00 GPU-hours" in bob_page
    standing = re.search(r'<table id="fair-share">.*?<tbody>(.*?)</tbody>', bob_page, re.S).group(1)
    assert re.findall(r"<td>([^<]*)</td>", standing)[:3] == ["default", "0.00", "0.00"]


def test_queue_view_needs_a_login_and_shows_only_my_queues(api, admin):
    assert api.client.get("/queue", follow_redirects=False).headers["location"] == "/login?next=%2Fqueue"
    assert api.client.post("/api/v1/accounts", json={"name": "vision"}, headers=admin).status_code == 201
    r = api.client.put("/api/v1/queues/vq", json={"account": "vision"}, headers=admin)
    assert r.status_code == 200, r.text
    api.user(admin, "alice")
    html = browser_for(api.client, "alice", "password-123").get("/queue").text
    assert 'data-queue="default"' in html and 'data-queue="vq"' not in html
    assert "Nothing is waiting in this queue." in html
