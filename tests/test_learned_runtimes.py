"""The live loop gives the policy each job's expected run time, learned from its user's finished jobs of the same
kind (caldera/server/learned_runtimes.py), as the simulator does from a trace."""

from __future__ import annotations

from tests.test_loop_fake_runtime import fake_api, fake_settings  # noqa: F401 - fixtures
from tests.test_runs import _submit, _until


def test_a_users_next_job_is_expected_to_run_as_long_as_their_last_ones(fake_api) -> None:  # noqa: F811
    api, _ = fake_api
    admin = api.login("admin", "admin-password")
    loop = api.client.app.state.loop
    seen = []
    inner = loop.policy

    def recording(snap):
        seen.append(snap)
        return inner(snap)

    recording.name = inner.name
    loop.policy = recording
    first = _submit(api, admin, name="a", command=["sleep", "0.4"], resources={"gpu": 1})
    assert _until(api, admin, first, {"Running"})
    assert seen[-1].running[0].expected_runtime_s is None  # nothing learned yet
    _until(api, admin, first, {"Succeeded"})
    second = _submit(api, admin, name="b", command=["sleep", "1.2"], resources={"gpu": 1})
    _until(api, admin, second, {"Succeeded"})
    blocker = _submit(api, admin, name="block", command=["sleep", "600"], resources={"gpu": 4})
    _until(api, admin, blocker, {"Running"})  # every GPU taken: the next jobs wait
    waiting = _submit(api, admin, name="c", command=["sleep", "60"], resources={"gpu": 4})
    loop.tick()
    (queued,) = [j for j in seen[-1].queued if j.id == waiting]
    # the mean of the two runs: 0.4 s and 1.2 s, each measured between the loop's observations of it
    assert 0.4 <= queued.expected_runtime_s <= 1.2 + 2.0
    assert queued.expected_runtime_s > 0.8 - 0.05
    notebook = _submit(api, admin, name="n", kind="jupyter", resources={"gpu": 4})
    loop.tick()
    (nb,) = [j for j in seen[-1].queued if j.id == notebook]
    assert nb.expected_runtime_s is None  # another kind: batch jobs say nothing about sessions
