"""Parts of the container runtime that need no podman: GPUs as devices, reading conmon's log format, and the env
file and launcher that hand a job its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from caldera.runtime.container import devices, envfile, logs
from caldera.runtime.local.rundir import RunDir


def test_fake_gpus_keep_their_indices_and_get_no_device(monkeypatch) -> None:
    assert devices.device_args((2, 0), real=False) == ([], "2,0")
    assert devices.device_args((), real=True) == ([], "")


def test_real_gpus_are_cdi_devices_when_the_host_has_a_cdi_spec(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(devices, "_CDI_DIRS", (str(tmp_path),))
    args, visible = devices.device_args((3, 5), real=True)
    assert args[:2] == ["--device", "/dev/nvidia3"] and "/dev/nvidia5" in args
    assert visible == "0,1"  # the container sees only its own GPUs, numbered from 0
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    assert devices.device_args((3, 5), real=True) == (
        ["--device", "nvidia.com/gpu=3", "--device", "nvidia.com/gpu=5"],
        "0,1",
    )


RECORDS = (
    b"2026-12-03T18:14:41.0+00:00 stdout F hello world\n"
    b"2026-12-03T18:14:41.1+00:00 stderr P part\n"
    b"2026-12-03T18:14:41.2+00:00 stdout F , done\n"
    b"2026-12-03T18:14:41.3+00:00 stdout F \n"
)
JOB_BYTES = b"hello world\npart, done\n\n"


def test_a_log_reads_as_the_jobs_bytes_from_any_offset(tmp_path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(RECORDS)
    for offset in (0, 1, 6, 12, 16, len(JOB_BYTES), 999):
        assert b"".join(logs.read(path, offset, False, lambda: True)) == JOB_BYTES[offset:], offset
    assert list(logs.read(tmp_path / "missing.log", 0, False, lambda: True)) == []


def test_following_a_log_waits_for_half_written_records_and_stops_when_the_job_ended(tmp_path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(b"2026-12-03T18:14:41.0+00:00 stdout F first\n2026-12-03T18:14:41.1+00:00 std")
    ended = threading.Event()

    def writer() -> None:
        time.sleep(0.3)
        with open(path, "ab") as f:
            f.write(b"out F second\n")
        ended.set()

    threading.Thread(target=writer).start()
    assert b"".join(logs.read(path, 0, True, ended.is_set)) == b"first\nsecond\n"


HARD_VALUES = {
    "MULTI": "one\ntwo\n\n",
    "CR": "line\r",
    "QUOTES": 'it\'s "q" `id` $(id) ${HOME} \\ \\n %s %b \\0101 ==a=b',
    "LONG": "é" * 32768,  # over the line podman's env file reads
    "IFS": "ab\n",
    "PWD": "/nowhere",
    "PS1": "",
    "EMPTY": "",
    "PLAIN": "plain=1",
    "caldera_set": "a name of the launcher's own\n",
}


def test_the_env_launcher_hands_every_value_over_exactly(tmp_path) -> None:
    """What podman would read from the env file, then the launcher run by the host's sh: the command sees each
    value byte for byte, and the env file holds only lines podman reads whole."""
    args, launcher = envfile.write(RunDir(tmp_path), 0, HARD_VALUES)
    assert args[:2] == ["--env-file", str(tmp_path / "rank-0.env")] and launcher[0] == envfile.SHELL
    lines = (tmp_path / "rank-0.env").read_text().splitlines()
    assert all(len(line.encode()) < 60_000 and "\r" not in line for line in lines)
    from_file = dict(line.split("=", 1) for line in lines)
    assert from_file == {"EMPTY": "", "PLAIN": "plain=1", "QUOTES": HARD_VALUES["QUOTES"]}
    host_dir, mount, ro = args[args.index("--volume") + 1].split(":")
    assert (mount, ro) == (envfile.MOUNT, "ro") and oct(os.stat(host_dir).st_mode & 0o777) == "0o555"
    dump = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]
    out = subprocess.run(
        ["sh", f"{host_dir}/launch", *dump], env={"PATH": os.environ["PATH"], **from_file}, capture_output=True
    )
    got = json.loads(out.stdout)
    assert {k: got.get(k) for k in HARD_VALUES} == HARD_VALUES, out.stderr


def test_an_env_the_env_file_holds_needs_no_launcher(tmp_path) -> None:
    args, launcher = envfile.write(RunDir(tmp_path), 1, {"A": "1", "IFS": "x", "Q": "'\" ="})
    assert launcher == [] and "--volume" not in args
    assert (tmp_path / "rank-1.env").read_text() == "A=1\nIFS=x\nQ='\" =\n"
