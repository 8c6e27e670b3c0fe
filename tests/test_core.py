import pytest

from caldera.core.resources import Resources
from caldera.core.spec import JobKind, SpecError, load_spec_yaml, parse_spec
from caldera.core.states import InvalidTransition, JobState, check_transition


def test_yaml_spec_with_shell_command_and_defaults():
    spec = load_spec_yaml("name: train\ncommand: python train.py --lr 0.1\nresources: {gpu: 2, gpu_model: A100}\n")
    assert spec.command == ["python", "train.py", "--lr", "0.1"]
    assert spec.kind is JobKind.BATCH
    assert spec.resources.gpu_model == "a100"
    assert spec.resources.vector() == {"cpu": 1.0, "memory": 1024.0, "gpu": 2.0, "gpu/a100": 2.0}


@pytest.mark.parametrize(
    "data, field",
    [
        ({"name": "x", "command": "true", "bogus": 1}, "bogus"),
        ({"name": "x", "command": "true", "resources": {"gpu": -1}}, "resources.gpu"),
        ({"name": "x"}, "spec"),
        ({"name": "x", "command": "true", "replicas": 2}, "spec"),
        ({"name": "bad name", "command": "true"}, "name"),
        ({"name": "x", "command": "true", "env": {"1A": "v"}}, "env"),
    ],
)
def test_invalid_specs_name_the_field(data, field):
    with pytest.raises(SpecError) as exc:
        parse_spec(data)
    assert field in [e["field"] for e in exc.value.errors], exc.value.errors


def test_not_yaml_mapping():
    with pytest.raises(SpecError):
        load_spec_yaml("- a\n- b\n")


def test_distributed_world_size_and_jupyter_needs_no_command():
    d = parse_spec(
        {
            "name": "ddp",
            "kind": "distributed",
            "command": "python t.py",
            "replicas": 2,
            "procs_per_replica": 3,
            "resources": {"gpu": 1},
        }
    )
    assert d.world_size == 6 and d.total_gpus() == 2
    assert parse_spec({"name": "nb", "kind": "jupyter"}).interactive


def test_state_machine():
    check_transition(JobState.QUEUED, JobState.STARTING)
    check_transition(JobState.RUNNING, JobState.PREEMPTED)
    check_transition(JobState.PREEMPTED, JobState.QUEUED)
    for src, dst in [
        (JobState.SUCCEEDED, JobState.RUNNING),
        (JobState.QUEUED, JobState.SUCCEEDED),
        (JobState.CANCELLED, JobState.QUEUED),
    ]:
        with pytest.raises(InvalidTransition):
            check_transition(src, dst)
    assert JobState.LOST.terminal and not JobState.PREEMPTED.terminal


def test_resources_frozen():
    r = Resources(gpu=1)
    with pytest.raises(Exception):
        r.gpu = 2
