"""Notifications (docs/governance.md): what happened to a user's jobs, told on the channels they chose.

``events`` names what can be told and renders it in the reader's language; ``outbox`` records a notification and
queues its outside deliveries; ``dispatch`` delivers them through the notifiers registered as entry points of
``caldera.notifiers`` (``registry``), retrying with backoff, never inside the scheduling loop."""
