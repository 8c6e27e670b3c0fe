"""`caldera`: start the platform, log in, submit and follow jobs, administer accounts and queues."""

from __future__ import annotations

import getpass
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from caldera.cli.accounting import accounting
from caldera.cli.agent import agent
from caldera.cli.catalogue import data_app
from caldera.cli.common import call, client, console, err, ts
from caldera.cli.files import files_app
from caldera.cli.governance import account_admin, request_app
from caldera.cli.images import images_app
from caldera.cli.jobs import register as register_jobs
from caldera.cli.jobs import requeue
from caldera.cli.metrics import BY, IDLE, PLOT, SINCE, USAGE_OUTPUT, UsageFormat, gpu_hours, idle_hours, top
from caldera.cli.nodes_admin import nodes_admin_app
from caldera.cli.output import OUTPUT, Format, emit
from caldera.cli.remote import register as register_remote
from caldera.cli.sessions import register as register_sessions
from caldera.client import Client, forget_credentials, load_credentials, save_credentials

app = typer.Typer(help="Caldera: GPUs for labs.", no_args_is_help=True, pretty_exceptions_show_locals=False)
admin_app = typer.Typer(help="Users and accounts (admins).", no_args_is_help=True)
queue_app = typer.Typer(help="Queues, quotas and caps.", no_args_is_help=True)
app.add_typer(admin_app, name="admin")
app.add_typer(queue_app, name="queue")
app.add_typer(images_app, name="images")
app.add_typer(files_app, name="files")
app.add_typer(data_app, name="data")


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
    console.print(f"  runtime: {platform.settings.runtime} ({_runtime_why(runtime)})")
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
    from caldera.runtime.default import default_choice

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
    pair = call(anon.post, "/auth/login", {"username": username, "password": password})
    authed = Client(url, pair["access_token"])
    tok = call(authed.post, "/tokens", {"name": f"cli@{_hostname()}"})
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
    call(client().put, "/me/password", {"current_password": old, "password": new})
    console.print("password changed; other sessions were logged out")


@app.command()
def logout() -> None:
    """Forget the token that `caldera login` stored here (revoke it with `caldera tokens revoke` first to end it)."""
    path = forget_credentials()
    console.print(f"logged out; removed {path}" if path else "not logged in")


tokens_app = typer.Typer(help="Your personal API tokens.", no_args_is_help=True)
app.add_typer(tokens_app, name="tokens")


@tokens_app.command("list")
def tokens_list(output: Format = OUTPUT) -> None:
    emit(call(client().get, "/tokens"), output, _tokens_table)


def _tokens_table(rows: list[dict]) -> None:
    t = Table("ID", "NAME", "PREFIX", "CREATED", "EXPIRES", "LAST USED", "REVOKED", box=None)
    for tok in rows:
        t.add_row(
            str(tok["id"]),
            tok["name"],
            tok["prefix"] + "…",
            ts(tok["created_at"]),
            ts(tok["expires_at"]),
            ts(tok["last_used_at"]),
            "yes" if tok["revoked"] else "",
        )
    console.print(t)


@tokens_app.command("create")
def tokens_create(
    name: str = typer.Argument(..., help="what it is for"),
    days: int | None = typer.Option(None, help="expires after this many days; never when omitted"),
) -> None:
    """Print a new token (shown once) for scripts: CALDERA_TOKEN=... caldera ls."""
    tok = call(client().post, "/tokens", {"name": name, "expires_in_days": days})
    console.print(tok["token"], soft_wrap=True)


@tokens_app.command("revoke")
def tokens_revoke(token_id: int) -> None:
    tok = call(client().delete, f"/tokens/{token_id}")
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
    key = call(client().post, "/ssh-keys", {"public_key": file.read_text(errors="replace"), "name": name})
    typer.echo(f"added key {key['id']} ({key['name']}): {key['key_type']} {key['fingerprint']}")


@ssh_keys_app.command("list")
def ssh_keys_list() -> None:
    """One key a line, as ``ssh-keygen -l`` would show it: the fingerprint whole, whatever the terminal's width."""
    for k in call(client().get, "/ssh-keys"):
        typer.echo(f"{k['id']:>4}  {k['fingerprint']}  {k['key_type']:<19}  {ts(k['created_at'])}  {k['name']}")


@ssh_keys_app.command("remove")
def ssh_keys_remove(key_id: int) -> None:
    key = call(client().delete, f"/ssh-keys/{key_id}")
    typer.echo(f"key {key['id']} ({key['name']}) removed")


@app.command()
def nodes(output: Format = OUTPUT) -> None:
    """Nodes, which GPUs are idle now and who holds the others (a job, "busy": someone else's job, "other": not
    started by Caldera)."""
    emit(call(client().nodes), output, _nodes_table)


def _nodes_table(rows: list[dict]) -> None:
    t = Table("NODE", "CPUS", "MEMORY", "GPUS", "IDLE", "MODELS", "HELD BY", box=None)
    for n in rows:
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
def usage(
    output: UsageFormat = USAGE_OUTPUT,
    since: str | None = SINCE,
    by: str = BY,
    plot: Path | None = PLOT,
    idle: bool = IDLE,
) -> None:
    """Your usage and limits in each of your queues; with --since, GPU-hours allocated and used per day; with
    --idle, the low-utilisation list over --since (7d unless given; admins and account admins)."""
    if idle:
        return idle_hours(since or "7d", by, output)
    if since:
        return gpu_hours(since, by, output, plot)
    if output is UsageFormat.csv:
        err.print("[red]-o csv is for GPU-hours: add --since[/red]")
        raise typer.Exit(2)
    emit(call(client().usage), Format(output.value), _usage_table)


def _usage_table(u: dict) -> None:
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
    u = call(
        client().post,
        "/users",
        {"username": username, "password": pw, "role": "admin" if admin else "user", "accounts": account or []},
    )
    console.print(f"created {u['username']} ({u['role']}) in {', '.join(u['accounts'])}")


@admin_app.command("users")
def list_users(output: Format = OUTPUT) -> None:
    emit(call(client().get, "/users"), output, _users_table)


def _users_table(rows: list[dict]) -> None:
    t = Table("USER", "ROLE", "ACCOUNTS", box=None)
    for u in rows:
        t.add_row(u["username"], u["role"], ", ".join(u["accounts"]))
    console.print(t)


@admin_app.command("set-password")
def set_password(username: str, password: str = typer.Option(None, help="prompted when omitted")) -> None:
    """Reset another user's password; their sessions and other logins end."""
    pw = password or getpass.getpass(f"new password for {username}: ")
    call(client().put, f"/users/{username}/password", {"password": pw})
    console.print(f"password of {username} reset; their sessions were logged out")


@admin_app.command("create-account")
def create_account(name: str, description: str = "") -> None:
    call(client().post, "/accounts", {"name": name, "description": description})
    console.print(f"created account {name} with queue {name}")


@admin_app.command("add-member")
def add_member(account: str, username: str) -> None:
    call(client().post, f"/accounts/{account}/members", {"username": username})
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
    call(client().put, f"/queues/{name}", body)
    console.print(f"queue {name} set")


@queue_app.command("grant")
def queue_grant(queue: str, username: str, priority: str = typer.Argument(..., help="high, normal, low")) -> None:
    """Let a user submit jobs up to a priority class in a queue."""
    call(client().put, f"/queues/{queue}/grants/{username}", {"max_priority": priority})
    console.print(f"{username} may submit up to {priority} in {queue}")


@queue_app.command("revoke-grant")
def queue_revoke_grant(queue: str, username: str) -> None:
    call(client().delete, f"/queues/{queue}/grants/{username}")
    console.print(f"{username} is back to the queue's own limit in {queue}")


@queue_app.command("ls")
def queue_ls(output: Format = OUTPUT) -> None:
    emit(call(client().get, "/queues"), output, _queues_table)


def _queues_table(rows: list[dict]) -> None:
    t = Table("QUEUE", "ACCOUNT", "WEIGHT", "QUOTAS g/d/c", "USER CAPS", "IN USE", box=None)
    for q in rows:
        caps = ", ".join(f"{k}={v}" for k, v in q["user_caps"].items() if v is not None)
        t.add_row(
            q["name"], q["account"], f"{q['weight']:g}", _quotas(q["quotas"]), caps or "-", _vec(q["usage"]["in_use"])
        )
    console.print(t)


register_jobs(app)
register_remote(app)
register_sessions(app)
app.add_typer(nodes_admin_app, name="node")
app.add_typer(request_app, name="request")
admin_app.command("account-admin")(account_admin)
admin_app.command("requeue")(requeue)

from caldera.sim.cli import app as sim_app  # noqa: E402 - sub-app mounted after the commands above

app.add_typer(sim_app, name="sim")

from caldera.cli.interference import app as interference_app  # noqa: E402
from caldera.cli.profile import profile_command  # noqa: E402

app.add_typer(interference_app, name="interference")
app.command("profile")(profile_command)
app.command("top")(top)
app.command("agent")(agent)
app.command("accounting")(accounting)

if __name__ == "__main__":
    app()
