"""Right-sizing advice as a pure function of a finished job's use, and its words in both languages."""

from __future__ import annotations

from caldera.governance.advice import GIB, Advice, GpuUse, JobUse, advise, applied
from caldera.server.web import i18n
from caldera.server.web.reason_text import ADVICE, Say

ZH = Say(i18n.translations("zh").gettext)
EN = Say(str)


def gpu(percent: float, peak_gib: float = 70, total_gib: float = 80, samples: int = 100) -> GpuUse:
    return GpuUse(percent, peak_gib * GIB, total_gib * GIB, samples)


def test_asked_for_four_used_one_and_little_memory():
    use = JobUse(4, 8, [gpu(85, peak_gib=11), gpu(0, 0), gpu(2, 0), gpu(0, 0)], cpu_cores=2)
    assert advise(use) == [
        Advice("FewerGpus", {"asked": 4, "used": 1}),
        Advice("SmallGpuMemory", {"peak_gib": 11.0, "total_gib": 80}),
    ]


def test_a_job_that_uses_what_it_asked_for_gets_no_advice():
    assert advise(JobUse(2, 8, [gpu(90), gpu(75)], cpu_cores=3)) == []


def test_gpus_never_used_and_cpu_bound():
    assert advise(JobUse(1, 2, [gpu(0.2, 0)], cpu_cores=0.1))[0] == Advice("UnusedGpus", {"asked": 1, "percent": 0.2})
    cpu_bound = advise(JobUse(1, 2, [gpu(8)], cpu_cores=2.0))
    assert Advice("CpuBound", {"gpu_percent": 8.0, "cores": 2.0, "asked": 2}) in cpu_bound


def test_no_advice_without_enough_data():
    assert advise(JobUse(4, 8, [gpu(85, 11)])) == []  # three GPUs without samples
    assert advise(JobUse(1, 8, [gpu(0, 0, samples=2)])) == []
    assert advise(JobUse(0, 8, [])) == []


def test_advice_reads_in_both_languages_with_its_values():
    for code, message in ADVICE.items():
        assert ZH._(message.msgid) != message.msgid, code
    piece = {"code": "FewerGpus", "params": {"asked": 4, "used": 1}}
    assert EN.advice(piece) == "asked for 4 GPUs and used 1: ask for 1 next time"
    assert ZH.advice(piece) == "申请了 4 块 GPU，只用了 1 块：下次申请 1 块即可"
    assert ZH.advice({"code": "Unknown", "params": {}}) == "Unknown"


def test_the_advice_applied_to_a_resubmitted_job():
    body = {"name": "wide", "command": ["python", "train.py"], "resources": {"gpu": 4, "cpu": 8}}
    fewer = [{"code": "FewerGpus", "params": {"asked": 4, "used": 1}},
             {"code": "SmallGpuMemory", "params": {"peak_gib": 11.0, "total_gib": 80}}]  # fmt: skip
    assert applied(body, fewer) == {**body, "resources": {"gpu": 1, "cpu": 8, "gpu_memory_mib": 14080},
                                    "shareable": True}  # fmt: skip
    assert body["resources"]["gpu"] == 4  # the finished job's own body is not changed
    two = [{"code": "FewerGpus", "params": {"asked": 4, "used": 2}}]
    assert applied(body, two)["resources"] == {"gpu": 2, "cpu": 8} and "shareable" not in applied(body, two)
    unused = [{"code": "UnusedGpus", "params": {"asked": 4, "percent": 0.0}}]
    assert applied(body, unused)["resources"] == {"cpu": 8}
    distributed = {**body, "replicas": 2}
    assert applied(distributed, fewer) == distributed
