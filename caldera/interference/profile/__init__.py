"""``caldera profile``: a zoo of small PyTorch training workloads, measured alone and in mixes.

* :mod:`.zoo`: the 16 workloads (random initialisation, synthetic batches, no downloads).
* :mod:`.harness`: runs them, samples metrics (CPU and memory always; NVML on a GPU) and writes the solo and
  co-located records.
"""
