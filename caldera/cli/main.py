"""`caldera`: start the platform, log in, submit and follow jobs, administer accounts and queues."""

from __future__ import annotations

import getpass
import json
import os
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from caldera.cli.client import ApiError, Client, load_credentials, save_credentials
from caldera.cli.images import images_app

app = typer.Typer(help="Caldera: GPUs for labs.", no_args_is_help=True, pretty_exceptions_show_locals=False)
admin_app = typer.Typer(help="Users and accounts (admins).", no_args_is_help=True)
queue_app = typer.Typer(help="Queues, quotas and caps.", no_args_is_help=True)
app.add_typer(admin_app, name="admin")
app.add_typer(queue_app, name="queue")
app.add_typer(images_app, name="images")
console = Console()
err = Console(stderr=True)


def _ts(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _client() -> Client:
    try:
        return Client.from_config()
    except ApiError as exc:
        err.print(f"[red]{exc.detail}[/red]")
        raise typer.Exit(1) from None


def _call(fn, *args, **kwargs) -> Any:
    try:
        return fn(*args, **kwargs)
    except ApiError as exc:
        err.print(f"[red]error {exc.status}: {exc.detail}[/red]")
        for e in exc.errors:
            err.print(f"  [yellow]{e.get('field')}[/yellow]: {e.get('reason')}")
        raise typer.Exit(1) from None


# ---- the platform ------------------------------------------------------------------------------------------------
@app.command()
def up(
    data_dir: Path | None = typer.Option(None, help="where the database, logs and keys live (~/.caldera)"),
    host: str | None = typer.Option(None, help="address to bind (127.0.0.1)"),
    port: int | None = typer.Option(None, help="port (8642)"),
    fake_gpus: int = typer.Option(0, help="declare N fake GPUs when this host has none"),
    fake_gpu_model: str = typer.Option("fake", help="model name of the fake GPUs"),
    policy: str | None = typer.Option(None, help="scheduling policy"),
    runtime: str | None = typer.Option(
        None,
        help="where jobs run: local (processes on this host), container (podman), kubernetes; by default container "
        "where podman and its base image are usable, else local. Jobs already running stay with the runtime that "
        "started them",
    ),
    unisolated: bool = typer.Option(
        False, help="run jobs as the server's own user, isolated from nothing (a single-user machine without root)"
    ),
) -> None:
    """Start the API, the lab origin, the scheduler and a runtime in one process (SQLite by default)."""
    from pydantic import ValidationError

    from caldera.config import FakeGpu, Settings
    from caldera.server.identity import isolation_problem
    from caldera.server.metrics import start as start_metrics
    from caldera.server.platform import Platform
    from caldera.server.serve import serve
    from caldera.server.tenancy import bootstrap

    overrides: dict[str, Any] = {
        k: v
        for k, v in {"data_dir": data_dir, "host": host, "port": port, "policy": policy, "runtime": runtime}.items()
        if v
    }
    if fake_gpus:
        overrides["fake_gpus"] = [FakeGpu(model=fake_gpu_model) for _ in range(fake_gpus)]
    if unisolated:
        overrides["run_jobs_as"] = "server"
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:  # bad CALDERA_* settings: say which, not a traceback
        for e in exc.errors():
            where = ".".join(str(x) for x in e["loc"]) or "settings"
            err.print(f"[red]error:[/red] {where}: {e['msg']}")
        raise typer.Exit(1) from None
    if settings.run_jobs_as == "owner":
        problem = isolation_problem(settings, sys.executable)
        if problem:
            err.print(f"[red]Caldera cannot isolate jobs:[/red] {problem}")
            raise typer.Exit(1)
    else:
        err.print(
            "[bold yellow]Jobs are NOT isolated:[/bold yellow] they run as this server's user and can read "
            "its database and keys, each other's files and processes, and act as any platform user. "
            "Use this only where every user is trusted."
        )
    with console.status("migrating the database and discovering devices"):
        platform = Platform.create(settings)
        with platform.session() as db:
            first = bootstrap(db, settings.initial_admin_password)
            db.commit()
        nodes = platform.nodes()
    console.print(
        f"[bold green]Caldera[/bold green] at [link]{settings.url}[/link]  (data in {settings.data_dir}); "
        f"labs at {settings.lab_url_template}"
    )
    console.print(f"  runtime: {settings.runtime} ({_runtime_why(runtime)})")
    for n in nodes:
        models = ", ".join(sorted({d.model for d in n.gpus})) or "no GPUs"
        console.print(f"  node {n.name}: {n.cpu:g} CPUs, {n.memory_mib // 1024} GiB, {len(n.gpus)} GPUs ({models})")
    if first and settings.initial_admin_password:
        console.print(
            f"[bold]First admin[/bold]: user [cyan]{first[0]}[/cyan], password from CALDERA_INITIAL_ADMIN_PASSWORD"
        )
    elif first:
        user, password = first
        console.print(
            f"[bold]First admin[/bold]: user [cyan]{user}[/cyan] password [cyan]{password}[/cyan] "
            "(shown once; change it with `caldera passwd`)"
        )
    registry_proc = _start_registry(settings)
    agent, prometheus_proc, said = start_metrics(platform)
    console.print(f"  {said}")
    try:
        serve(platform)
    finally:
        for proc in (registry_proc, prometheus_proc):
            if proc is not None:
                proc.terminate()
        if agent is not None:
            agent.stop()


@app.command("settings")
def show_settings() -> None:
    """Every setting (environment variable), its default and what it is: the table of docs/settings.md."""
    from caldera.settings_doc import markdown

    sys.stdout.write(markdown())


def _runtime_why(chosen: str | None) -> str:
    from caldera.runtime.registry import default_choice

    if chosen:
        return "--runtime"
    if os.environ.get("CALDERA_RUNTIME"):
        return "CALDERA_RUNTIME"
    return default_choice()[1]


def _start_registry(settings):
    """The platform's image registry (docker-registry on 127.0.0.1) when installed and none is given by URL."""
    from caldera.images import registry

    try:
        proc = registry.start_local(settings)
    except registry.RegistryError as exc:
        err.print(f"[yellow]no image registry:[/yellow] {exc}")
        return None
    if proc is not None or settings.registry_url:
        console.print(f"  images: registry at {registry.url(settings)}")
    return proc


# ---- sessions ----------------------------------------------------------------------------------------------------
@app.command()
def login(
    url: str = typer.Option(None, help="platform URL"),
    username: str = typer.Option(None, "--username", "-u"),
    password: str = typer.Option(None, "--password", "-p", help="prompted when omitted"),
) -> None:
    """Log in and store a personal API token (0600) for the other commands."""
    url = url or load_credentials().get("url") or "http://127.0.0.1:8642"
    username = username or typer.prompt("user")
    password = password or getpass.getpass("password: ")
    anon = Client(url)
    pair = _call(anon.post, "/auth/login", {"username": username, "password": password})
    authed = Client(url, pair["access_token"])
    tok = _call(authed.post, "/tokens", {"name": f"cli@{_hostname()}"})
    path = save_credentials(url, tok["token"], username)
    console.print(f"logged in to {url} as [cyan]{username}[/cyan]; token saved in {path}")


def _hostname() -> str:
    import socket

    return socket.gethostname()


@app.command()
def passwd(
    password: str = typer.Option(None, "--password", help="the new one; prompted when omitted"),
    current: str = typer.Option(None, "--current", help="the current one; prompted when omitted"),
) -> None:
    """Change your password. Your browser sessions and other logins end; personal API tokens stay."""
    old = current or getpass.getpass("current password: ")
    new = password or getpass.getpass("new password: ")
    _call(_client().put, "/me/password", {"current_password": old, "password": new})
    console.print("password changed; other sessions were logged out")


tokens_app = typer.Typer(help="Your personal API tokens.", no_args_is_help=True)
app.add_typer(tokens_app, name="tokens")


@tokens_app.command("list")
def tokens_list() -> None:
    t = Table("ID", "NAME", "PREFIX", "CREATED", "EXPIRES", "LAST USED", "REVOKED", box=None)
    for tok in _call(_client().get, "/tokens"):
        t.add_row(
            str(tok["id"]),
            tok["name"],
            tok["prefix"] + "…",
            _ts(tok["created_at"]),
            _ts(tok["expires_at"]),
            _ts(tok["last_used_at"]),
            "yes" if tok["revoked"] else "",
        )
    console.print(t)


@tokens_app.command("create")
def tokens_create(
    name: str = typer.Argument(..., help="what it is for"),
    days: int | None = typer.Option(None, help="expires after this many days; never when omitted"),
) -> None:
    """Print a new token (shown once) for scripts: CALDERA_TOKEN=... caldera ls."""
    tok = _call(_client().post, "/tokens", {"name": name, "expires_in_days": days})
    console.print(tok["token"], soft_wrap=True)


@tokens_app.command("revoke")
def tokens_revoke(token_id: int) -> None:
    tok = _call(_client().delete, f"/tokens/{token_id}")
    console.print(f"token {tok['id']} ({tok['name']}) revoked")


ssh_keys_app = typer.Typer(help="Your SSH public keys (they reach your own jobs).", no_args_is_help=True)
app.add_typer(ssh_keys_app, name="ssh-keys")
MAX_KEY_FILE_BYTES = 16 * 1024  # the API's limit on a key; a larger file is not a public key


@ssh_keys_app.command("add")
def ssh_keys_add(
    file: Path = typer.Argument(..., help="a public key file, e.g. ~/.ssh/id_ed25519.pub", exists=True, dir_okay=False),
    name: str = typer.Option("", help="what it is called in listings (the key's comment when omitted)"),
) -> None:
    if file.stat().st_size > MAX_KEY_FILE_BYTES:
        err.print(f"[red]{file} is larger than {MAX_KEY_FILE_BYTES} bytes: not a public key[/red]")
        raise typer.Exit(1)
    key = _call(_client().post, "/ssh-keys", {"public_key": file.read_text(errors="replace"), "name": name})
    typer.echo(f"added key {key['id']} ({key['name']}): {key['key_type']} {key['fingerprint']}")


@ssh_keys_app.command("list")
def ssh_keys_list() -> None:
    """One key a line, as ``ssh-keygen -l`` would show it: the fingerprint whole, whatever the terminal's width."""
    for k in _call(_client().get, "/ssh-keys"):
        typer.echo(f"{k['id']:>4}  {k['fingerprint']}  {k['key_type']:<19}  {_ts(k['created_at'])}  {k['name']}")


@ssh_keys_app.command("remove")
def ssh_keys_remove(key_id: int) -> None:
    key = _call(_client().delete, f"/ssh-keys/{key_id}")
    typer.echo(f"key {key['id']} ({key['name']}) removed")


# ---- jobs --------------------------------------------------------------------------------------------------------
@app.command()
def submit(
    spec_file: Path = typer.Argument(..., exists=True, readable=True, help="job spec, YAML"),
    account: str | None = typer.Option(None),
    queue: str | None = typer.Option(None),
) -> None:
    """Submit a job from a YAML spec."""
    import yaml

    try:
        body = yaml.safe_load(spec_file.read_text())
    except yaml.YAMLError as exc:
        err.print(f"[red]{spec_file} is not valid YAML: {exc}[/red]")
        raise typer.Exit(1) from None
    if not isinstance(body, dict):
        err.print(f"[red]{spec_file} must hold a mapping[/red]")
        raise typer.Exit(1)
    if account:
        body["account"] = account
    if queue:
        body["queue"] = queue
    job = _call(_client().post, "/jobs", body)
    console.print(f"submitted [bold]{job['id']}[/bold] ({job['name']}) to {job['queue']}: {job['state']}")


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


@app.command("ls")
def ls(
    all_users: bool = typer.Option(False, "--all", help="everyone's jobs (admins)"),
    state: list[str] | None = typer.Option(None, help="only these states"),
) -> None:
    """List jobs."""
    rows = _call(_client().get, "/jobs", all=all_users or None, state=state)
    t = Table(box=None)
    for col in ("ID", "NAME", "USER", "KIND", "QUEUE", "GPUS", "STATE", "SUBMITTED", "REASON"):
        t.add_column(col)
    for j in rows:
        why = j["pending_reasons"][0]["message"] if j["state"] == "Queued" and j["pending_reasons"] else j["message"]
        style = _STATE_STYLE.get(j["state"], "")
        t.add_row(
            j["id"],
            j["name"],
            j["user"] or "",
            j["kind"],
            j["queue"],
            str(j["gpus"]),
            f"[{style}]{j['state']}[/{style}]" if style else j["state"],
            _ts(j["submitted_at"]),
            why or "",
        )
    console.print(t)


@app.command()
def describe(job_id: str) -> None:
    """Spec, state and every event of a job."""
    j = _call(_client().get, f"/jobs/{job_id}")
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
        t.add_row(_ts(e["at"]), e["from"] or "", e["to"], e["reason"], e["message"])
    console.print(t)


@app.command()
def why(job_id: str) -> None:
    """Why a job is waiting."""
    w = _call(_client().get, f"/jobs/{job_id}/why")
    # a job waits in Queued here, in Starting where a cluster admits it (Kueue): its reasons show either way
    if w["state"] not in ("Queued", "Starting") or (w["state"] == "Starting" and not w["pending"]):
        console.print(f"{w['id']} is {w['state']} ({w['reason']}): {w['message']}")
        return
    if not w["pending"]:
        console.print(f"{w['id']} is queued; the scheduler has not looked at it yet")
    for r in w["pending"]:
        console.print(f"[yellow]{r['code']}[/yellow]: {r['message']}")


_WAITING = ("Queued", "Starting")


def _say_why_until_started(client: Any, job_id: str) -> None:
    """``logs -f`` on a job that has not started: say why it waits (again whenever that changes) instead of
    printing nothing for minutes; returns once it started or ended."""
    said: list[str] = []
    while True:
        w = client.get(f"/jobs/{job_id}/why")
        if w["state"] not in _WAITING or (w["state"] == "Starting" and not w["pending"]):
            return
        now = [f"{r['code']}: {r['message']}" for r in w["pending"]] or ["queued; the scheduler has not looked yet"]
        if now != said:
            for line in now:
                err.print(f"[yellow]waiting[/yellow] {line}")
            said = now
        time.sleep(2)


@app.command()
def logs(
    job_id: str,
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends; says why it waits"),
    rank: int | None = typer.Option(None, help="rank of a distributed job (0)"),
) -> None:
    """Print a job's output."""
    client = _client()
    try:
        if follow:
            _say_why_until_started(client, job_id)
        for chunk in client.stream_logs(job_id, rank, follow):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    except ApiError as exc:
        err.print(f"[red]error {exc.status}: {exc.detail}[/red]")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass


@app.command()
def cancel(job_id: str) -> None:
    """Cancel a job (SIGTERM, then SIGKILL after the grace period)."""
    j = _call(_client().post, f"/jobs/{job_id}/cancel")
    console.print(f"{j['id']}: {j['state']}" + (" (stopping)" if j["state"] in ("Running", "Starting") else ""))


@app.command()
def wait(job_id: str, timeout: float = typer.Option(0, help="seconds; 0 waits forever")) -> None:
    """Wait until a job ends; exit code 0 only if it succeeded."""
    client, t0 = _client(), time.time()
    while True:
        j = _call(client.get, f"/jobs/{job_id}")
        if j["state"] in ("Succeeded", "Failed", "Cancelled", "Lost"):
            console.print(f"{job_id}: {j['state']}")
            raise typer.Exit(0 if j["state"] == "Succeeded" else 1)
        if timeout and time.time() - t0 > timeout:
            err.print(f"{job_id} still {j['state']} after {timeout:g}s")
            raise typer.Exit(2)
        time.sleep(1)


@app.command()
def nodes() -> None:
    """Nodes, which GPUs are idle now and who holds the others (a job, "busy": someone else's job, "other": not
    started by Caldera)."""
    t = Table("NODE", "CPUS", "MEMORY", "GPUS", "IDLE", "MODELS", "HELD BY", box=None)
    for n in _call(_client().get, "/nodes"):
        idle = sum(1 for g in n["gpus"] if not g["job"])
        held = Counter(g["job"] for g in n["gpus"] if g["job"])
        t.add_row(
            n["name"],
            f"{n['cpu']:g}",
            f"{n['memory_mib'] // 1024} GiB",
            str(len(n["gpus"])),
            str(idle),
            ", ".join(sorted({g["model"] for g in n["gpus"]})),
            ", ".join(f"{holder}×{count}" for holder, count in held.items()),
        )
    console.print(t)


@app.command()
def usage() -> None:
    """Your usage and limits in each of your queues."""
    u = _call(_client().get, "/usage")
    console.print(f"{u['user']}: {u['decayed_gpu_seconds'] / 3600:.2f} decayed GPU-hours")
    t = Table("QUEUE", "ACCOUNT", "MINE", "QUEUE IN USE", "CAPS", "QUOTAS", box=None)
    for q in u["queues"]:
        caps = ", ".join(f"{k}={v}" for k, v in q["user_caps"].items() if v is not None) or "-"
        t.add_row(q["queue"], q["account"], _vec(q["mine"]), _vec(q["queue_in_use"]), caps, _quotas(q["quotas"]))
    console.print(t)


def _vec(v: dict[str, float]) -> str:
    return ", ".join(f"{k}={x:g}" for k, x in sorted(v.items())) or "-"


def _quotas(quotas: dict[str, dict]) -> str:
    """guarantee/deserved/capability per resource, as `caldera queue set` takes them."""

    def num(x: float | None, none: str) -> str:
        return none if x is None else f"{x:g}"

    return (
        "; ".join(
            f"{k}: {num(v['guarantee'], '0')}/{num(v['deserved'], '-')}/{num(v['capability'], '∞')}"
            for k, v in quotas.items()
        )
        or "-"
    )


# ---- admin -------------------------------------------------------------------------------------------------------
@admin_app.command("create-user")
def create_user(
    username: str,
    password: str = typer.Option(None, help="prompted when omitted"),
    admin: bool = typer.Option(False, help="make an admin"),
    account: list[str] | None = typer.Option(None, help="accounts to join (default: default)"),
) -> None:
    pw = password or getpass.getpass(f"password for {username}: ")
    u = _call(
        _client().post,
        "/users",
        {"username": username, "password": pw, "role": "admin" if admin else "user", "accounts": account or []},
    )
    console.print(f"created {u['username']} ({u['role']}) in {', '.join(u['accounts'])}")


@admin_app.command("users")
def list_users() -> None:
    t = Table("USER", "ROLE", "ACCOUNTS", box=None)
    for u in _call(_client().get, "/users"):
        t.add_row(u["username"], u["role"], ", ".join(u["accounts"]))
    console.print(t)


@admin_app.command("set-password")
def set_password(username: str, password: str = typer.Option(None, help="prompted when omitted")) -> None:
    """Reset another user's password; their sessions and other logins end."""
    pw = password or getpass.getpass(f"new password for {username}: ")
    _call(_client().put, f"/users/{username}/password", {"password": pw})
    console.print(f"password of {username} reset; their sessions were logged out")


@admin_app.command("create-account")
def create_account(name: str, description: str = "") -> None:
    _call(_client().post, "/accounts", {"name": name, "description": description})
    console.print(f"created account {name} with queue {name}")


@admin_app.command("add-member")
def add_member(account: str, username: str) -> None:
    _call(_client().post, f"/accounts/{account}/members", {"username": username})
    console.print(f"{username} joined {account}")


def _parse_quota(items: list[str]) -> dict[str, dict]:
    """gpu/a100=GUARANTEE:DESERVED:CAPABILITY, any part may be empty."""
    out: dict[str, dict] = {}
    for item in items:
        key, _, spec = item.partition("=")
        parts = (spec.split(":") + ["", "", ""])[:3]
        if not key or not spec or len(spec.split(":")) > 3:
            raise typer.BadParameter(f"{item!r}: expected RESOURCE=GUARANTEE:DESERVED:CAPABILITY")
        q: dict[str, float] = {}
        for name, val in zip(("guarantee", "deserved", "capability"), parts):
            if val:
                try:
                    q[name] = float(val)
                except ValueError:
                    raise typer.BadParameter(f"{item!r}: {val!r} is not a number") from None
        out[key] = q
    return out


@queue_app.command("set")
def queue_set(
    name: str,
    account: str = typer.Option(...),
    quota: list[str] | None = typer.Option(None, help="RESOURCE=GUARANTEE:DESERVED:CAPABILITY, e.g. gpu/a100=2:4:8"),
    weight: float = typer.Option(1.0),
    user_max_gpus: int | None = typer.Option(None),
    user_max_interactive: int | None = typer.Option(None),
    user_max_running: int | None = typer.Option(None),
    max_priority: str | None = typer.Option(None, help="highest class anyone may submit (kept when omitted)"),
    decay_tolerance: float | None = typer.Option(None, help="slowdown a shared job of this queue accepts (0-1]"),
) -> None:
    """Create or replace a queue's quotas and per-user caps (priority grants are kept)."""
    body: dict[str, Any] = {
        "account": account,
        "weight": weight,
        "quotas": _parse_quota(quota or []),
        "user_caps": {
            "max_gpus": user_max_gpus,
            "max_interactive_jobs": user_max_interactive,
            "max_running_jobs": user_max_running,
        },
    }
    if max_priority:
        body["max_priority"] = max_priority
    if decay_tolerance is not None:
        body["decay_tolerance"] = decay_tolerance
    _call(_client().put, f"/queues/{name}", body)
    console.print(f"queue {name} set")


@queue_app.command("grant")
def queue_grant(queue: str, username: str, priority: str = typer.Argument(..., help="high, normal, low")) -> None:
    """Let a user submit jobs up to a priority class in a queue."""
    _call(_client().put, f"/queues/{queue}/grants/{username}", {"max_priority": priority})
    console.print(f"{username} may submit up to {priority} in {queue}")


@queue_app.command("revoke-grant")
def queue_revoke_grant(queue: str, username: str) -> None:
    _call(_client().delete, f"/queues/{queue}/grants/{username}")
    console.print(f"{username} is back to the queue's own limit in {queue}")


@queue_app.command("ls")
def queue_ls() -> None:
    t = Table("QUEUE", "ACCOUNT", "WEIGHT", "QUOTAS g/d/c", "USER CAPS", "IN USE", box=None)
    for q in _call(_client().get, "/queues"):
        caps = ", ".join(f"{k}={v}" for k, v in q["user_caps"].items() if v is not None)
        t.add_row(
            q["name"], q["account"], f"{q['weight']:g}", _quotas(q["quotas"]), caps or "-", _vec(q["usage"]["in_use"])
        )
    console.print(t)


from caldera.sim.cli import app as sim_app  # noqa: E402 - sub-app mounted after the commands above

app.add_typer(sim_app, name="sim")

from caldera.cli.interference import app as interference_app  # noqa: E402
from caldera.cli.profile import profile_command  # noqa: E402

app.add_typer(interference_app, name="interference")
app.command("profile")(profile_command)

if __name__ == "__main__":
    app()
