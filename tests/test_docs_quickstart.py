"""Every command of docs/quickstart.md, in its order, against a real `caldera up`: the page is what a newcomer types.

The first block starts the platform with `scripts/up ARGS`, which installs the package and then runs `caldera up ARGS`
(checked below); the test starts `caldera up` with the same arguments on a port of its own (the `server` fixture),
since the package is installed already. Every other command runs in bash as written, with the page's URL replaced by
the test server's and `<id>` by the id `caldera submit` printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, free_port, kill_job_processes, server_env, traversable
from tests.test_server_process import token

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "quickstart.md"
PAGE_URL = "http://127.0.0.1:8642"


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S)


def commands(block: str) -> list[str]:
    """The block's commands, a heredoc together with the lines up to its end marker."""
    out: list[str] = []
    lines = block.splitlines()
    while lines:
        line = lines.pop(0)
        if not line.strip():
            continue
        if m := re.search(r"<<'(\w+)'", line):
            end = lines.index(m.group(1))
            line = "\n".join([line, *lines[: end + 1]])
            del lines[: end + 1]
        out.append(line)
    return out


def test_the_quick_start_parses_into_the_commands_it_shows():
    blocks = sh_blocks(PAGE.read_text())
    assert blocks[0].split("#")[0].split()[0] == "scripts/up"
    cmds = [c for b in blocks[1:] for c in commands(b)]
    assert cmds[0].startswith("caldera login") and any(c.startswith("cat > job.yaml <<'YAML'\n") for c in cmds)
    assert "caldera submit job.yaml" in cmds and "caldera queue ls" in cmds
    assert all(c.startswith(("caldera ", "cat > ")) for c in cmds), cmds


def test_the_chinese_quick_start_shows_the_same_commands():
    """docs/quickstart.zh.md is the zh site's page: the commands this test runs, in the same order."""
    assert sh_blocks((ROOT / "docs" / "quickstart.zh.md").read_text()) == sh_blocks(PAGE.read_text())


@pytest.fixture
def quickstart_server(tmp_path):
    """`caldera up` with the arguments the page gives `scripts/up`, which hands them on to it."""
    up = (ROOT / "scripts" / "up").read_text()
    assert up.rstrip().endswith('exec caldera up "$@"'), "scripts/up no longer ends in `caldera up ARGS`"
    args = sh_blocks(PAGE.read_text())[0].split("#")[0].split()[1:]
    gpus, model = int(args[args.index("--fake-gpus") + 1]), args[args.index("--fake-gpu-model") + 1]
    srv = ServerProcess(
        traversable(tmp_path) / "data", free_port(), server_env(tmp_path, "sqlite:///" + str(tmp_path / "c.db")),
        gpus=gpus, gpu_model=model,
    )  # fmt: skip
    srv.start()
    yield srv
    srv.stop()
    kill_job_processes(srv.data_dir)


def test_every_quick_start_command_runs(quickstart_server, tmp_path):
    srv = quickstart_server
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "caldera"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m caldera.cli.main "$@"\n')
    shim.chmod(0o755)
    env = {**srv.env, "PATH": f"{bin_dir}:{srv.env['PATH']}", "PYTHONPATH": str(ROOT)}
    work = tmp_path / "work"
    work.mkdir()
    job_id = ""
    seen: dict[str, str] = {}
    for cmd in [c for b in sh_blocks(PAGE.read_text())[1:] for c in commands(b)]:
        run = cmd.replace(PAGE_URL, srv.url).replace("<id>", job_id)
        password = "admin-password\n"  # what `caldera login` asks for
        r = subprocess.run(
            ["bash", "-c", run], cwd=work, env=env, input=password, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        seen[cmd] = r.stdout
        if cmd.startswith("caldera submit"):
            job_id = re.search(r"\b([0-9a-f]{8,})\b", r.stdout).group(1)
    h = token(srv)
    jobs = {j["name"]: j for j in httpx.get(srv.url + "/api/v1/jobs?all=true", headers=h).json()}
    assert jobs["hello"]["id"] == job_id and jobs["hello"]["state"] == "Succeeded"
    assert re.search(r"my GPUs: \d", seen["caldera logs -f <id>"])
    assert "hello from a GPU job" in next(v for k, v in seen.items() if k.startswith("caldera run --gpus 1 --wait"))
    assert jobs["sleeper"]["state"] == "Cancelled"
    assert re.search(r"vision.*2.*4.*8", seen["caldera queue ls"]) and "decayed GPU-hours" in seen["caldera usage"]
    alice = httpx.post(srv.url + "/api/v1/auth/login", json={"username": "alice", "password": "change-me-please"})
    assert alice.status_code == 200
