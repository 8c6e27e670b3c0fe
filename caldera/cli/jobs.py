"""Job verbs: submit, run (inline), ls, describe, why, logs, cancel, wait. Ids may be unique prefixes; a job array's
id stands for all its tasks, ``ARRAY_INDEX`` for one."""

from __future__ import annotations

import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from caldera.cli.common import call, client, console, err, say_error, ts
from caldera.cli.output import OUTPUT, Format, emit
from caldera.client import ApiError, Client
from caldera.core.arrays import array_state
from caldera.core.states import JobState

STATES = tuple(s.value for s in JobState)
_STATE_STYLE = {
    "Running": "green",
    "Succeeded": "bold green",
    "Failed": "red",
    "Lost": "red",
    "Queued": "yellow",
    "Cancelled": "dim",
    "Preempted": "magenta",
    "Starting": "cyan",
}
_WAITING = ("Queued", "Starting")


def register(app: typer.Typer) -> None:
    for fn in (submit, run, ls, describe, why, logs, cancel, hold, release, wait):
        app.command(fn.__name__ if fn is not ls else "ls")(fn)


AFTER = typer.Option(
    [],
    "--after",
    help="JOB[:ok|:any]: start only after JOB (a job, or every task of a job array) succeeded (ok, the default) "
    "or ended (any); repeat for several",
)
ARRAY = typer.Option(
    None,
    "--array",
    help="submit a job array, one task per index: 0-99, 1,3,5, 0-20:5; %N runs at most N at once (0-99%8). "
    "Each task finds its index in CALDERA_ARRAY_INDEX",
)


def _dependencies(c: Client, items: list[str]) -> list[dict[str, str]]:
    """``JOB[:ok|:any]`` as the spec's ``after`` entries, each id made whole (a unique prefix is enough)."""
    out = []
    for item in items:
        job_id, _, when = item.partition(":")
        if when not in ("", "ok", "any"):
            raise typer.BadParameter(f"{item!r}: expected JOB, JOB:ok or JOB:any", param_hint="--after")
        out.append({"job": call(c.resolve, job_id)[1], "when": when or "ok"})
    return out


def _submitted(job: dict) -> None:
    if "counts" in job:  # a job array
        limit = f", at most {job['max_running']} running at once" if job["max_running"] else ""
        console.print(
            f"submitted job array [bold]{job['id']}[/bold] ({job['name']}, {job['size']} tasks{limit}) "
            f"to {job['queue']}: {job['state']}"
        )
        return
    console.print(f"submitted [bold]{job['id']}[/bold] ({job['name']}) to {job['queue']}: {job['state']}")


def submit(
    spec_file: Path = typer.Argument(..., exists=True, readable=True, help="job spec, YAML"),
    account: str | None = typer.Option(None),
    queue: str | None = typer.Option(None),
    after: list[str] = AFTER,
    array: str | None = ARRAY,
) -> None:
    """Submit a job (or with --array, a job array) from a YAML spec."""
    import yaml

    try:
        body = yaml.safe_load(spec_file.read_text())
    except yaml.YAMLError as exc:
        err.print(f"[red]{spec_file} is not valid YAML: {exc}[/red]")
        raise typer.Exit(1) from None
    if not isinstance(body, dict):
        err.print(f"[red]{spec_file} must hold a mapping[/red]")
        raise typer.Exit(1)
    c = client()
    if after:
        body["after"] = _dependencies(c, after)
    _submitted(call(c.submit, body, array=array, account=account, queue=queue))


def run(
    command: list[str] = typer.Argument(..., help="the command, after --: caldera run --gpus 2 -- python train.py"),
    gpus: int = typer.Option(0, help="whole GPUs per replica"),
    image: str | None = typer.Option(None, help="image to run in (the platform's base image when omitted)"),
    name: str | None = typer.Option(None, help="job name (the command's program when omitted)"),
    queue: str | None = typer.Option(None),
    account: str | None = typer.Option(None),
    kind: str = typer.Option("batch", help="batch or distributed"),
    replicas: int = typer.Option(1, help="replicas of a distributed job"),
    cpu: float | None = typer.Option(None, help="CPU cores per replica"),
    memory_mib: int | None = typer.Option(None, help="memory per replica, MiB"),
    gpu_model: str | None = typer.Option(None, help="e.g. a100; any model when omitted"),
    env: list[str] = typer.Option([], "--env", "-e", help="NAME=VALUE (repeat)"),
    priority: str | None = typer.Option(None, help="high, normal or low"),
    wait_: bool = typer.Option(False, "--wait", help="follow its logs and exit with the job's exit code"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the spec as YAML and submit nothing"),
    after: list[str] = AFTER,
    array: str | None = ARRAY,
) -> None:
    """Submit a job from the command line, as `sbatch --wrap` would."""
    if array and wait_:
        raise typer.BadParameter(
            "--wait follows one job: use `caldera wait ARRAY` for a job array", param_hint="--wait"
        )
    spec = _inline_spec(command, gpus, image, name, queue, account, kind, replicas, cpu, memory_mib, gpu_model)
    spec["env"] = _env(env)
    if priority:
        spec["priority"] = priority
    c = None
    if after:  # a dry run resolves the ids too: what it prints is what would be submitted
        c = client()
        spec["after"] = _dependencies(c, after)
    if dry_run:
        import yaml

        sys.stdout.write(yaml.safe_dump(spec, sort_keys=False))
        return
    c = c or client()
    job = call(c.submit, spec, array=array)
    _submitted(job)
    if wait_:
        raise typer.Exit(_follow_to_end(c, job["id"]))


def _inline_spec(command, gpus, image, name, queue, account, kind, replicas, cpu, memory_mib, gpu_model) -> dict:
    resources: dict[str, Any] = {"gpu": gpus}
    for key, value in (("cpu", cpu), ("memory_mib", memory_mib), ("gpu_model", gpu_model)):
        if value is not None:
            resources[key] = value
    default_name = re.sub(r"[^A-Za-z0-9._-]", "-", Path(command[0]).name).lstrip("._-") or "job"
    spec: dict[str, Any] = {"name": (name or default_name)[:128], "kind": kind, "command": command}
    spec["resources"] = resources
    if kind == "distributed" or replicas != 1:
        spec["replicas"] = replicas
    for key, value in (("image", image), ("queue", queue), ("account", account)):
        if value:
            spec[key] = value
    return spec


def _env(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: expected NAME=VALUE")
        out[key] = value
    return out


def _follow_to_end(c: Client, job_id: str) -> int:
    """Logs followed until the job ends; the job's exit code (1 when it ended without one)."""
    try:
        _say_why_until_started(c, job_id)
        for chunk in c.logs(job_id, follow=True):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
        j = c.wait(job_id)
    except ApiError as exc:
        say_error(exc)
        return 1
    err.print(f"{job_id}: {j['state']}" + (f" (exit code {j['exit_code']})" if j["exit_code"] is not None else ""))
    if j["exit_code"] is not None:
        return int(j["exit_code"])
    return 0 if j["state"] == "Succeeded" else 1


def _since(value: str) -> float:
    """30d, 12h, 45m or an ISO date, as a UNIX time."""
    m = re.fullmatch(r"(\d+)([dhm])", value.strip())
    if m:
        unit = {"d": "days", "h": "hours", "m": "minutes"}[m.group(2)]
        return (datetime.now() - timedelta(**{unit: int(m.group(1))})).timestamp()
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise typer.BadParameter(f"{value!r}: expected 30d, 12h, 45m or a date such as 2026-01-31") from None


def _states(given: list[str]) -> list[str]:
    """States by any case; an unknown one is an error naming the valid ones."""
    by_lower = {s.lower(): s for s in STATES}
    out = []
    for s in given:
        if s.lower() not in by_lower:
            raise typer.BadParameter(f"unknown state {s!r}; valid states: {', '.join(STATES)}", param_hint="--state")
        out.append(by_lower[s.lower()])
    return out


def _filtered(
    c: Client,
    all_users: bool,
    state: list[str] | None,
    user: str | None,
    account: str | None,
    queue: str | None,
    since: str | None,
    name: str | None = None,
) -> list[dict]:
    rows = call(c.jobs, all=all_users or user is not None, state=_states(state or []), limit=5000)
    after = _since(since) if since else None
    return [
        j
        for j in rows
        if (user is None or j["user"] == user)
        and (account is None or j["account"] == account)
        and (queue is None or j["queue"] == queue)
        and (after is None or j["submitted_at"] >= after)
        and (name is None or j["name"] == name)
    ]


def _is_admin(c: Client) -> bool:
    try:
        return c.me().get("role") == "admin"
    except ApiError:
        return False


def ls(
    all_users: bool = typer.Option(False, "--all", help="everyone's jobs (admins; others see only their own)"),
    state: list[str] | None = typer.Option(None, help="only these states (any case; repeat)"),
    user: str | None = typer.Option(None, help="only this user's jobs (admins)"),
    account: str | None = typer.Option(None, help="only this account's jobs"),
    queue: str | None = typer.Option(None, help="only this queue's jobs"),
    since: str | None = typer.Option(None, help="submitted since: 30d, 12h, 45m or a date"),
    output: Format = OUTPUT,
) -> None:
    """List jobs, newest first."""
    c = client()
    rows = _filtered(c, all_users, state, user, account, queue, since)
    if all_users and not _is_admin(c):
        err.print("[yellow]--all shows everyone's jobs to admins only: these are yours[/yellow]")
    emit(rows, output, _jobs_table)


def _jobs_table(rows: list[dict]) -> None:
    """One row per job, and one per job array (where its newest-listed task would be) with its tasks counted."""
    t = Table(box=None)
    for col in ("ID", "NAME", "USER", "KIND", "QUEUE", "GPUS", "STATE", "SUBMITTED", "REASON"):
        t.add_column(col, no_wrap=col == "ID", overflow="fold")
    tasks: dict[str, list[dict]] = {}
    for j in rows:
        if j.get("array_id"):
            tasks.setdefault(j["array_id"], []).append(j)
    for j in rows:
        if j.get("array_id"):
            if j["array_id"] not in tasks:
                continue  # its array's row is printed
            group = tasks.pop(j["array_id"])
            counts = Counter(x["state"] for x in group)
            state, why = array_state(JobState(x) for x in counts).value, _counted(counts)
            j = {**j, "id": j["array_id"], "name": f"{j['name']}[{len(group)} tasks]", "state": state}
        else:
            queued = j["state"] == "Queued" and j["pending_reasons"]
            why = j["pending_reasons"][0]["message"] if queued else j["message"]
        style = _STATE_STYLE.get(j["state"], "")
        t.add_row(
            j["id"],
            j["name"],
            j["user"] or "",
            j["kind"],
            j["queue"],
            str(j["gpus"]),
            f"[{style}]{j['state']}[/{style}]" if style else j["state"],
            ts(j["submitted_at"]),
            why or "",
        )
    console.print(t)


def _counted(counts: dict[str, int]) -> str:
    """``2 Running, 6 Queued, 2 Succeeded``: a job array's tasks per state, in the states' order."""
    return ", ".join(f"{counts[s]} {s}" for s in STATES if counts.get(s))


def describe(job_id: str, output: Format = OUTPUT) -> None:
    """Spec, state and every event of a job; a job array's tasks with their states."""
    c = client()
    kind, whole = call(c.resolve, job_id)
    if kind == "arrays":
        emit(call(c.get, f"/arrays/{whole}"), output, _array_table)
        return
    emit(call(c.get, f"/jobs/{whole}"), output, _describe_table)


def _array_table(a: dict) -> None:
    limit = f", at most {a['max_running']} running" if a["max_running"] else ""
    console.print(f"[bold]{a['id']}[/bold] {a['name']}  job array {a['array']} ({a['size']} tasks{limit})")
    console.print(f"user {a['user']}  account {a['account']}  queue {a['queue']}  [bold]{a['state']}[/bold]")
    console.print(_counted(a["counts"]))
    t = Table("INDEX", "JOB", "STATE", "EXIT", "REASON", box=None, title="tasks", title_justify="left")
    for x in a["tasks"]:
        exit_code = str(x["exit_code"]) if x["exit_code"] is not None else "-"
        t.add_row(str(x["index"]), x["id"], x["state"], exit_code, x["reason"])
    console.print(t)


def _describe_table(j: dict) -> None:
    console.print(f"[bold]{j['id']}[/bold] {j['name']}  {j['kind']}  [bold]{j['state']}[/bold] ({j['reason']})")
    console.print(
        f"user {j['user']}  account {j['account']}  queue {j['queue']}  priority {j['priority']}  "
        f"attempt {j['attempt']}  exit code {j['exit_code'] if j['exit_code'] is not None else '-'}"
    )
    for a in j["allocations"]:
        console.print(f"  on {a['node']}: GPUs {a['gpus'] or '-'}  {a['cpu']:g} CPUs  {a['memory_mib']} MiB")
    if j["state"] == "Queued":
        for r in j["pending_reasons"]:
            console.print(f"  waiting: [yellow]{r['code']}[/yellow] {r['message']}")
    console.print("[bold]spec[/bold]")
    console.print_json(json.dumps(j["spec"]))
    t = Table("TIME", "FROM", "TO", "REASON", "MESSAGE", box=None, title="events", title_justify="left")
    for e in j["events"]:
        t.add_row(ts(e["at"]), e["from"] or "", e["to"], e["reason"], e["message"])
    console.print(t)


def why(job_id: str, output: Format = OUTPUT) -> None:
    """Why a job is waiting."""
    emit(call(client().why, job_id), output, _why_text)


def _why_text(w: dict) -> None:
    # a job waits in Queued here, in Starting where a cluster admits it (Kueue): its reasons show either way
    if w["state"] not in _WAITING or (w["state"] == "Starting" and not w["pending"]):
        console.print(f"{w['id']} is {w['state']} ({w['reason']}): {w['message']}")
        return
    if not w["pending"]:
        console.print(f"{w['id']} is queued; the scheduler has not looked at it yet")
    for r in w["pending"]:
        console.print(f"[yellow]{r['code']}[/yellow]: {r['message']}")


def _say_why_until_started(c: Client, job_id: str) -> None:
    """``logs -f`` on a job that has not started: say why it waits (again whenever that changes) instead of
    printing nothing for minutes; returns once it started or ended."""
    said: list[str] = []
    while True:
        w = c.why(job_id)
        if w["state"] not in _WAITING or (w["state"] == "Starting" and not w["pending"]):
            return
        now = [f"{r['code']}: {r['message']}" for r in w["pending"]] or ["queued; the scheduler has not looked yet"]
        if now != said:
            for line in now:
                err.print(f"[yellow]waiting[/yellow] {line}")
            said = now
        time.sleep(2)


def logs(
    job_id: str,
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends; says why it waits"),
    rank: int | None = typer.Option(None, help="rank of a distributed job (0)"),
) -> None:
    """Print a job's output."""
    c = client()
    try:
        job_id = c.resolve_job(job_id)
        if follow:
            _say_why_until_started(c, job_id)
        for chunk in c.logs(job_id, follow=follow, rank=rank):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    except ApiError as exc:
        say_error(exc)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass


def cancel(
    job_ids: list[str] | None = typer.Argument(None, help="job ids or unique prefixes"),
    state: list[str] | None = typer.Option(None, help="also every job of mine in these states"),
    name: str | None = typer.Option(None, help="also every job of mine with this name"),
) -> None:
    """Cancel jobs (SIGTERM, then SIGKILL after the grace period); exit 1 if any could not be."""
    c = client()
    targets = list(job_ids or [])
    if state or name:
        live = state or ["Queued", "Starting", "Running"]
        targets += [j["id"] for j in _filtered(c, False, live, None, None, None, None, name)]
    if not targets:
        raise typer.BadParameter("give job ids, --state or --name")
    stopping = ("Running", "Starting")
    said = _or_array(lambda j: f"{j['id']}: {j['state']}" + (" (stopping)" if j["state"] in stopping else ""))
    _each(targets, c.cancel, said)


def _or_array(say: Callable[[dict], str]) -> Callable[[dict], str]:
    """``say`` for a job; for a job array (the verbs take either), its tasks counted per state."""
    return lambda j: f"{j['id']}: job array, {_counted(j['counts'])}" if "counts" in j else say(j)


def _each(job_ids: list[str], act, say) -> None:
    """``act`` on every job; exit 1 if any failed."""
    failed = 0
    for job_id in dict.fromkeys(job_ids):
        try:
            console.print(say(act(job_id)))
        except ApiError as exc:
            err.print(f"[red]{job_id}: error {exc.status}: {exc.detail}[/red]")
            failed += 1
    if failed:
        raise typer.Exit(1)


def hold(
    job_ids: list[str] = typer.Argument(..., help="job ids or unique prefixes"),
    reason: str = typer.Option("", help="why, shown in `caldera why` and the portal"),
) -> None:
    """Keep waiting jobs from starting until released (an admin's hold only an admin releases)."""
    c = client()
    _each(job_ids, lambda j: c.hold(j, reason), _or_array(lambda j: f"{j['id']}: held ({j['state']})"))


def release(job_ids: list[str] = typer.Argument(..., help="job ids or unique prefixes")) -> None:
    """Let held jobs be scheduled again."""
    c = client()
    _each(job_ids, c.release, _or_array(lambda j: f"{j['id']}: released ({j['state']})"))


def requeue(
    job_id: str,
    reason: str = typer.Option("", help="why, shown in the job's events and its preemption notice"),
) -> None:
    """Stop a running job as a preemption does (SIGTERM, the notice, SIGKILL after the grace) and put it back in
    its queue (admins)."""
    j = call(client().requeue, job_id, reason)
    console.print(f"{j['id']}: requeued (stopping; it waits in {j['queue']} once its processes are gone)")


def wait(job_id: str, timeout: float = typer.Option(0, help="seconds; 0 waits forever")) -> None:
    """Wait until a job ends; exit code 0 only if it succeeded."""
    c = client()
    try:
        j = c.wait(job_id, timeout=timeout or None)
    except TimeoutError as exc:
        err.print(str(exc))
        raise typer.Exit(2) from None
    except ApiError as exc:
        say_error(exc)
        raise typer.Exit(1) from None
    console.print(f"{j['id']}: {j['state']}")
    raise typer.Exit(0 if j["state"] == "Succeeded" else 1)
