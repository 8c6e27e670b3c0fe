"""Job kinds, and which of them are interactive. A kind is batch when it runs a command to its end; every other kind
is a session someone works in (Jupyter Lab, and any kind added later, such as an IDE): governance's idle rule and
runtime limit for sessions, the scheduler's protection of interactive jobs, the session snapshot all ask
``is_interactive``, so a new kind is covered without naming it anywhere else."""

from __future__ import annotations

from enum import Enum


class JobKind(str, Enum):
    BATCH = "batch"
    DISTRIBUTED = "distributed"  # PyTorch distributed: replicas x procs_per_replica ranks, gang-scheduled
    JUPYTER = "jupyter"  # Jupyter Lab behind the platform's proxy
    VSCODE = "vscode"  # VS Code in the browser (code-server) behind the same proxy

    @property
    def interactive(self) -> bool:
        """A session the platform serves (on a lab origin of its own) rather than a command it runs."""
        return is_interactive(self.value)


BATCH_KINDS = frozenset({JobKind.BATCH.value, JobKind.DISTRIBUTED.value})
INTERACTIVE = "interactive"  # a queue's max_runtime_s key for every interactive kind it does not name


def is_interactive(kind: str) -> bool:
    return kind not in BATCH_KINDS
