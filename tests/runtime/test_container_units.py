"""Parts of the container runtime that need no podman: GPUs as devices, and reading conmon's log format."""

from __future__ import annotations

import threading
import time

from caldera.runtime.container import devices, logs


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
