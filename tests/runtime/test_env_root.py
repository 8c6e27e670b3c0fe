"""No value of a job's environment reaches a root process (issue 21, findings 1 and 2, and their class).

An attacker plants code in their own workspace (a preload and an audit library that record their euid, proxies of
the libraries root's programs load, a sitecustomize, a bash env file, a perl module, a gconv module, a podman
configuration naming a conmon of theirs...), then submits a job whose environment points the loader and every
interpreter at it: each row of ATTACKS, through every runtime. Afterwards no marker may have been written by uid 0
(nothing of theirs ran as root), and the job itself must have seen every value exactly as sent, newlines, quotes
and ``=`` included. ``test_each_planted_attack_works`` shows, as the job's owner and outside any runtime, that each
planted file is live, so a clean run means the runtime kept it from root, not that the attack was broken.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError

from caldera.config import Settings
from caldera.core.spec import MAX_ENV_ENTRIES, MAX_ENV_VALUE_CHARS, JobSpec
from caldera.runtime.base import Handle, LaunchError, LaunchRequest, Phase, RunAs, Runtime
from caldera.runtime.local import owner
from caldera.server.web import i18n
from caldera.server.web.reason_text import Say
from tests import needs
from tests.conftest import traversable

from .conftest import TERMINAL, wait_for

OWNER = RunAs("mallory", 201_021, 201_021)
# libraries root's programs load, and a program that loads each: libm (python, the process runtime's supervisor),
# libseccomp (podman and runc)
PROXIED = {"libm.so.6": sys.executable, "libseccomp.so.2": "podman"}
MARKER_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
unsigned int la_version(unsigned int v) { return v; }  /* what LD_AUDIT needs to keep the library */
__attribute__((constructor)) static void caldera_attack(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%d.%d", MARKERS, LABEL, (int)geteuid(), (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd >= 0) close(fd);
}
"""


def _py_marker(label: str, markers: Path) -> str:
    """Python source recording who ran it; only builtin modules, so it also runs as a fake standard library."""
    path = f"f'{markers}/{label}.{{posix.geteuid()}}.{{posix.getpid()}}'"
    return f"import posix\nposix.close(posix.open({path}, posix.O_CREAT | posix.O_WRONLY))\n"


def _sh_marker(label: str, markers: Path) -> str:
    return f': > "{markers}/{label}.$(id -u).$$"\n'


@dataclass(frozen=True)
class Planted:
    """The attacker's files, in the job owner's workspace, owned by them."""

    home: Path
    markers: Path  # every payload records itself here as <label>.<euid>.<pid>
    preload: Path
    audit: Path
    libdir: Path
    pypath: Path
    pyhome: Path
    userbase: Path
    startup: Path
    bashenv: Path
    shenv: Path
    perl: Path
    node_hook: Path
    gconv: Path
    conf: Path

    def markers_by(self) -> dict[int, list[str]]:
        """The markers written, by the uid that wrote them (the file's owner, and the euid the payload saw)."""
        out: dict[int, list[str]] = {}
        for m in self.markers.iterdir():
            uids = {m.lstat().st_uid}
            parts = m.name.rsplit(".", 2)
            if len(parts) == 3 and parts[1].isdigit():
                uids.add(int(parts[1]))
            for uid in uids:
                out.setdefault(uid, []).append(m.name)
        return out

    def clear(self) -> None:
        for m in self.markers.iterdir():
            m.unlink()


# where each attacker file lies in the attack directory of the owner's workspace
LAYOUT = {
    "preload": "preload.so",
    "audit": "audit.so",
    "libdir": "lib",
    "pypath": "pypath",
    "pyhome": "pyhome",
    "userbase": "userbase",
    "startup": "startup.py",
    "bashenv": "bashenv.sh",
    "shenv": "env.sh",
    "perl": "perl",
    "node_hook": "hook.js",
    "gconv": "gconv",
    "conf": "containers.conf",
}


def _gcc(out: Path, label: str, markers: Path, *extra: str) -> None:
    src = out.with_suffix(".c")
    src.write_text(MARKER_C)
    argv = ["gcc", "-shared", "-fPIC", f'-DMARKERS="{markers}"', f'-DLABEL="{label}"', "-o", str(out), str(src)]
    subprocess.run([*argv, *extra], check=True, capture_output=True, timeout=120)
    src.unlink()


def _loaded_from(program: str, soname: str) -> Path | None:
    """Where ``program`` loads ``soname`` from, as ldd says; None where the program is not here."""
    exe = shutil.which(program)
    out = subprocess.run(["ldd", exe], capture_output=True, text=True, timeout=60).stdout if exe else ""
    found = [line.split("=>")[1].split()[0] for line in out.splitlines() if line.strip().startswith(f"{soname} =>")]
    return Path(found[0]) if found else None


def _proxy(libdir: Path, markers: Path, soname: str, real: Path, build: Path) -> None:
    """``libdir/soname``: a library that records who loaded it and hands every symbol on to the real one, which it
    names by absolute path (the stub's soname), so that a program finding it through LD_LIBRARY_PATH still runs."""
    stub = build / f"stub-{soname}"
    (build / "stub.c").write_text("void caldera_stub(void) {}\n")
    cc = ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{real}", "-o", str(stub), str(build / "stub.c")]
    subprocess.run(cc, check=True, capture_output=True, timeout=120)
    dump = subprocess.run(["objdump", "-p", str(real)], check=True, capture_output=True, text=True).stdout
    defs = dump.partition("Version definitions:")[2].split("\n\n")[0].splitlines()
    versions = [f.split()[3] for f in defs if len(f.split()) == 4 and f.split()[1] != "0x01"]
    extra = [f"-Wl,-soname,{soname}", "-Wl,--no-as-needed", str(stub)]
    if versions:  # the versions the programs ask this soname for
        (build / f"{soname}.map").write_text("".join(f"{v} {{ }};\n" for v in versions))
        extra.append(f"-Wl,--version-script={build / f'{soname}.map'}")
    _gcc(libdir / soname, "ld_library_path", markers, *extra)


def plant(home: Path, run_as: RunAs) -> Planted:
    needs.program("gcc", "gcc libc6-dev")
    needs.program("objdump", "binutils")
    a, markers = home / "attack", home / "markers"
    build = a / "build"
    for d in (a, markers, build):
        d.mkdir(parents=True, exist_ok=True)
    markers.chmod(0o777)
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    p = Planted(home=home, markers=markers, **{field: a / name for field, name in LAYOUT.items()})
    _gcc(p.preload, "ld_preload", markers)
    _gcc(p.audit, "ld_audit", markers)
    p.libdir.mkdir(exist_ok=True)
    for soname, program in PROXIED.items():
        real = _loaded_from(program, soname)
        if real is not None:  # no podman: only the process runtime is tried, and it loads libm
            _proxy(p.libdir, markers, soname, real, build)
    node_marker = f"{markers}/node_options.${{process.geteuid()}}.${{process.pid}}"
    files = {
        p.pypath / "sitecustomize.py": _py_marker("sitecustomize", markers),
        p.pyhome / "lib" / py / "encodings" / "__init__.py": _py_marker("pythonhome", markers),
        p.userbase / "lib" / py / "site-packages" / "usercustomize.py": _py_marker("usercustomize", markers),
        p.startup: _py_marker("pythonstartup", markers),
        p.bashenv: _sh_marker("bash_env", markers),
        p.shenv: _sh_marker("sh_env", markers),
        p.perl / "CalderaAttack.pm": f'open(my $f, ">", "{markers}/perl5opt.$>.$$"); 1;\n',
        p.node_hook: f"require('fs').writeFileSync(`{node_marker}`, '')\n",
        p.gconv
        / "gconv-modules": "module CALDERA-ATTACK// INTERNAL attack 1\nmodule INTERNAL CALDERA-ATTACK// attack 1\n",
        # podman would run this "conmon" (as root) if it read the job's CONTAINERS_CONF
        a / "conmon": f'#!/bin/sh\n{_sh_marker("conmon", markers)}exec /usr/bin/conmon "$@"\n',
        p.conf: f'[engine]\nconmon_path = ["{a / "conmon"}"]\n',
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (a / "conmon").chmod(0o755)
    (Path(f"{p.conf}\n")).write_text(p.conf.read_text())  # a path with a line break in its name
    _gcc(p.gconv / "attack.so", "gconv_path", markers)
    subprocess.run(["rm", "-rf", str(build)], check=True)
    subprocess.run(["chown", "-R", f"{run_as.uid}:{run_as.gid}", str(a), str(markers)], check=True)
    return p


@dataclass(frozen=True)
class Attack:
    id: str
    env: Callable[[Planted], dict[str, str]]
    trigger: tuple[str, ...] = ()  # a program that, run as the owner with ``env``, shows the planted files work


PY = (sys.executable, "-c", "pass")
ATTACKS = [
    Attack("LD_PRELOAD", lambda p: {"LD_PRELOAD": str(p.preload)}, ("true",)),
    Attack("LD_PRELOAD-newline", lambda p: {"LD_PRELOAD": f"{p.preload}:\n"}, ("true",)),
    Attack("LD_AUDIT", lambda p: {"LD_AUDIT": str(p.audit)}, ("true",)),
    Attack("LD_AUDIT-newline", lambda p: {"LD_AUDIT": f"{p.audit}:\n"}, ("true",)),
    Attack("LD_LIBRARY_PATH", lambda p: {"LD_LIBRARY_PATH": str(p.libdir)}, PY),
    Attack("LD_LIBRARY_PATH-newline", lambda p: {"LD_LIBRARY_PATH": f"\n:{p.libdir}"}, PY),
    Attack("LD_DEBUG_OUTPUT", lambda p: {"LD_DEBUG": "files", "LD_DEBUG_OUTPUT": f"{p.markers}/ld_debug"}, ("true",)),
    Attack(
        "LD_misc", lambda p: {"LD_BIND_NOW": "1", "LD_BIND_NOT": "1\n", "LD_HWCAP_MASK": "0", "LD_ORIGIN_PATH": "/"}
    ),
    Attack("PYTHONPATH", lambda p: {"PYTHONPATH": str(p.pypath)}, PY),
    Attack("PYTHONPATH-newline", lambda p: {"PYTHONPATH": f"{p.pypath}:\n"}, PY),
    Attack("PYTHONHOME", lambda p: {"PYTHONHOME": str(p.pyhome)}, PY),
    Attack("PYTHONUSERBASE", lambda p: {"PYTHONUSERBASE": str(p.userbase)}, PY),
    Attack(
        "PYTHONSTARTUP-PYTHONINSPECT",
        lambda p: {"PYTHONSTARTUP": str(p.startup), "PYTHONINSPECT": "1", "PYTHONDEBUG": "1\n"},
        (sys.executable, "-i"),
    ),
    Attack("BASH_ENV", lambda p: {"BASH_ENV": str(p.bashenv)}, ("bash", "-c", "true")),
    Attack("ENV", lambda p: {"ENV": str(p.shenv)}, ("sh", "-i", "-c", "true")),
    Attack(
        "PERL5LIB-PERL5OPT", lambda p: {"PERL5LIB": str(p.perl), "PERL5OPT": "-MCalderaAttack"}, ("perl", "-e", "1")
    ),
    Attack("NODE_OPTIONS", lambda p: {"NODE_OPTIONS": f"--require {p.node_hook}"}, ("node", "-e", "0")),
    Attack("GCONV_PATH", lambda p: {"GCONV_PATH": str(p.gconv)}, ("iconv", "-f", "CALDERA-ATTACK", "-t", "UTF-8")),
    Attack("GLIBC_TUNABLES", lambda p: {"GLIBC_TUNABLES": "glibc.malloc.check=3:glibc.malloc.tcache_count=0"}),
    Attack(
        "MALLOC",
        lambda p: {"MALLOC_CHECK_": "3", "MALLOC_PERTURB_": "165", "MALLOC_ARENA_MAX": "1", "MALLOC_TOP_PAD_": "1\n"},
    ),
    Attack("CONTAINERS_CONF", lambda p: {"CONTAINERS_CONF": str(p.conf)}),
    Attack("CONTAINERS_CONF-newline", lambda p: {"CONTAINERS_CONF": f"{p.conf}\n"}),
    Attack("GODEBUG-newline", lambda p: {"GODEBUG": "madvdontneed=0\n", "GOMAXPROCS": "1\n", "TMPDIR": f"{p.home}\n"}),
    Attack("quotes", lambda p: {"QUOTES": 'it\'s "quoted" `id` $(id) ${HOME} \\ \\n %s %b \\0101'}),
    Attack("equals", lambda p: {"EQUALS": "a=b==c=", "EQ_EMPTY": "="}),
    Attack("newlines", lambda p: {"NEWLINES": "one\ntwo\n\n", "LEADING_NL": "\nx", "CR": "line\r", "CRLF": "a\r\nb"}),
    Attack("spaces-and-empty", lambda p: {"SPACES": "  x \t ", "EMPTY": "", "HASH": "#not a comment"}),
    Attack("long-multibyte", lambda p: {"LONG": "é" * MAX_ENV_VALUE_CHARS, "LONG_NL": "\n" + "x" * 30000}),
    Attack(
        "shell-names",
        lambda p: {"IFS": "ab\n", "PWD": "/nowhere", "OPTIND": "7", "OLDPWD": "", "SHLVL": "9", "PS1": ""},
    ),
]


RUNTIMES = ("local", "container")


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> Settings:
    needs.root()
    return Settings(data_dir=traversable(tmp_path_factory.mktemp("envroot")) / "data", node_name="env-node")


@pytest.fixture(scope="module")
def planted(settings: Settings) -> Planted:
    owner.platform_dir(settings.data_dir, 0o711)
    owner.platform_dir(settings.workspaces, 0o711)
    home = owner.owned_dir(settings.workspaces / OWNER.name, OWNER)
    return plant(home, OWNER)


@pytest.fixture(params=RUNTIMES)
def runtime(request, settings: Settings) -> Runtime:
    if request.param == "container":
        needs.podman()
        from caldera.runtime.container.runtime import ContainerRuntime

        return ContainerRuntime(settings)
    from caldera.runtime.local.runtime import LocalRuntime

    return LocalRuntime(settings)


@pytest.fixture
def run_job(runtime: Runtime, planted: Planted) -> Iterator[Callable[[dict[str, str]], tuple[Phase, bytes]]]:
    started: list[Handle] = []

    def _run(env: dict[str, str]) -> tuple[Phase, bytes]:
        job_id = f"env-{uuid.uuid4().hex[:10]}"
        spec = JobSpec(name=job_id, command=["env", "-0"], env=env)
        req = LaunchRequest(job_id, 1, spec, (), planted.home / "jobs" / job_id, run_as=OWNER, home=planted.home)
        try:
            h = runtime.launch(req)
        except LaunchError as exc:  # what ran on the way is judged all the same
            return Phase.LOST, f"launch refused: {exc.reason}: {exc}".encode()
        started.append(h)
        obs = wait_for(lambda: (o := runtime.observe(h)).phase in TERMINAL and o, 90, what=f"{job_id} to end")
        return obs.phase, b"".join(runtime.logs(h))

    yield _run
    for h in started:
        if runtime.observe(h).phase not in TERMINAL:
            runtime.stop(h, 0)


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_no_job_env_value_runs_anything_as_root_and_the_job_sees_them_all(run_job, planted, attack) -> None:
    env = attack.env(planted)
    planted.clear()
    phase, out = run_job(env)
    by_uid = planted.markers_by()
    assert 0 not in by_uid, f"ran as root: {by_uid[0]}"
    assert phase is Phase.SUCCEEDED, out[-2000:]
    seen = b"\0" + out
    for name, value in env.items():
        assert f"\0{name}={value}\0".encode() in seen, f"the job did not get {name}={value[:80]!r}"
    if attack.id.startswith(("LD_PRELOAD", "LD_AUDIT", "LD_DEBUG")):  # the job's own `env` loads them
        assert by_uid.get(OWNER.uid), f"the planted library never ran in the job: {by_uid}"


@pytest.mark.parametrize("attack", [a for a in ATTACKS if a.trigger], ids=[a.id for a in ATTACKS if a.trigger])
def test_each_planted_attack_works(planted, attack) -> None:
    """The control: run as the owner with the row's environment, the trigger program runs the planted code."""
    trigger = list(attack.trigger)
    trigger[0] = needs.program(trigger[0], {"node": "nodejs", "perl": "perl"}.get(trigger[0], trigger[0]))
    planted.clear()
    base = {"PATH": os.environ["PATH"], "HOME": str(planted.home)}
    subprocess.run(
        trigger,
        env={**base, **attack.env(planted)},
        user=OWNER.uid,
        group=OWNER.gid,
        extra_groups=[],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        cwd=planted.home,
        timeout=60,
    )
    assert planted.markers_by().get(OWNER.uid), f"{attack.id}: the planted code did not run"


def test_podman_and_its_helpers_start_with_a_fixed_environment_and_no_job_value(monkeypatch, settings, planted):
    """Every process the container runtime starts as root, for a job whose environment holds canaries: its
    environment is the fixed one (no job name, no job value) and no job value is in its arguments."""
    needs.podman()
    from caldera.runtime.container.runtime import ContainerRuntime

    calls: list[tuple[list[str], dict[str, str]]] = []
    real_run, real_popen = subprocess.run, subprocess.Popen

    def run(argv, *a, **kw):
        if kw.get("user") is None:
            calls.append((list(argv), dict(kw.get("env") or os.environ)))
        return real_run(argv, *a, **kw)

    class Popen(real_popen):  # type: ignore[misc,valid-type]
        def __init__(self, argv, *a, **kw):
            if kw.get("user") is None:
                calls.append((list(argv), dict(kw.get("env") or os.environ)))
            super().__init__(argv, *a, **kw)

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(subprocess, "Popen", Popen)
    env = {"LD_PRELOAD": f"{planted.preload}:\ncanary-1", "CANARY_PLAIN": "canary-2", "CANARY_MULTI": "canary-3\n"}
    rt = ContainerRuntime(settings)
    planted.clear()
    job_id = f"env-{uuid.uuid4().hex[:10]}"
    spec = JobSpec(name=job_id, command=["env", "-0"], env=env)
    h = rt.launch(LaunchRequest(job_id, 1, spec, (), planted.home / "jobs" / job_id, run_as=OWNER, home=planted.home))
    wait_for(lambda: rt.observe(h).phase in TERMINAL, 90, what="the job to end")
    assert b"\0CANARY_MULTI=canary-3\n\0" in b"\0" + b"".join(rt.logs(h))
    assert calls and any("run" in argv for argv, _ in calls)
    allowed = set(rt.podman.env)
    for argv, penv in calls:
        assert set(penv) <= allowed, (argv[:3], sorted(set(penv) - allowed))
        assert not [a for a in [*argv, *penv.values()] if "canary" in a], argv
    assert 0 not in planted.markers_by()


def test_env_names_and_values_are_checked_with_reasons() -> None:
    for bad in ("1A", "A-B", "A=B", "é", "A B", "A\n", "٣"):
        with pytest.raises(ValidationError, match="invalid environment variable name"):
            JobSpec(name="x", command=["true"], env={bad: "1"})
    with pytest.raises(ValidationError, match="the value of X contains a NUL byte"):
        JobSpec(name="x", command=["true"], env={"X": "a\0b"})
    with pytest.raises(ValidationError, match=f"at most {MAX_ENV_VALUE_CHARS} characters"):
        JobSpec(name="x", command=["true"], env={"X": "x" * (MAX_ENV_VALUE_CHARS + 1)})
    with pytest.raises(ValidationError, match=f"at most {MAX_ENV_ENTRIES} items"):
        JobSpec(name="x", command=["true"], env={f"V{i}": "" for i in range(MAX_ENV_ENTRIES + 1)})
    with pytest.raises(ValidationError) as err:  # the portal shows the API's reason in the reader's language
        JobSpec(name="x", command=["true"], env={"1A": "1"})
    zh = i18n.translations("zh").gettext
    assert Say(zh).english_reason(err.value.errors()[0]["msg"]).startswith("环境变量名 '1A' 无效")
    good = {"_": "", "a_1": "one\ntwo", "Q": 'it\'s "q" = =', "LD_PRELOAD": "x"}
    assert JobSpec(name="x", command=["true"], env=good).env == good
