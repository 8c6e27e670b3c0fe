"""Governance (issue 26, docs/governance.md): GPUs held idle are reclaimed, long jobs run by approval.

``decide`` holds the pure decisions (a job, its queue's rules and its utilisation samples in; warn, flag, stop or
nothing out, with a reason), so they are tested without time passing; ``samples`` reads the samples from
Prometheus; ``actions`` carries a decision out on the database (events, notifications, snapshots, stops) and
``requests`` holds the extend and lock requests and who may decide them."""
