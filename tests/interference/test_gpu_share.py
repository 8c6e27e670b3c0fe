"""What a shareable job is told about its GPU-memory request (caldera/runtime/gpu_share.py)."""

from __future__ import annotations

from caldera.core.cluster import Allocation
from caldera.core.spec import parse_spec
from caldera.runtime.gpu_share import device_memory_mib, mps_pipe_dir, shared_gpu_env
from tests.builders import node


def test_the_limit_covers_every_gpu_the_job_sees_and_the_fraction_the_smallest():
    spec = parse_spec({"name": "s", "command": "x", "shareable": True, "resources": {"gpu": 1, "gpu_memory_mib": 8000}})
    env = shared_gpu_env(spec, 16000)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8000M" and env["CALDERA_GPU_MEMORY_FRACTION"] == "0.5000"
    # a gang's request is per GPU (the spec refuses shareable gangs today; the scheduler can place them)
    gang = spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpu": 2})})
    assert shared_gpu_env(gang, 16000)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8000M,1=8000M"
    nodes = [node("n0", gpus=2)]
    assert device_memory_mib(nodes, [Allocation("n0", (0, 1), 1, 1)]) == 81920
    assert device_memory_mib(nodes, [Allocation("elsewhere", (0,), 1, 1)]) is None
    assert shared_gpu_env(spec.model_copy(update={"shareable": False}), 16000) == {}


def test_mps_is_seen_by_its_control_pipe(tmp_path):
    assert mps_pipe_dir({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}) is None
    (tmp_path / "control").touch()
    assert mps_pipe_dir({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}) == tmp_path.resolve()
