"""jobs.change_seq: a counter bumped by every write of a job row, so the live loop reads only the rows changed
since its last cycle (caldera/server/snapshot_jobs.py); job_deletions: the jobs deleted, with the counter's value

Revision ID: 0022
Revises: 0021

Bumped by database triggers, not by the ORM: an ORM event (before_update) misses Core ``update()`` statements,
bulk writes, foreign-key cascades (deleting an array deletes its jobs) and any SQL written by hand, and a column's
``onupdate`` misses the last two. A trigger sees every write of the table, whoever makes it.

The counter is one row (job_change_counter) updated in the writing transaction, not a sequence: SQLite's one write
lock, held until the transaction ends, makes transactions that write jobs take their values in the order they
commit. A reader that has seen every row up to value N can then never see a row committed later with a value of N
or less, which a sequence (values taken at the write, commits in any order) would allow.

On SQLite only. On PostgreSQL the counter row would be a lock taken at a transaction's first job write, after that
job's row lock: a transaction holding it (the loop's cycle, having written job Y) that then writes job X, and one
that has locked X and waits for it (a cancel of X), deadlock (tests/test_loop_snapshot_cache.py). So there the
triggers are not created, change_seq stays 0, and the loop reads every queued row each cycle, as before this
revision; the tables and the column are created on both databases, so that the schema is the models'.
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_SQLITE = [
    # recursive triggers are off by default; the WHEN stops the trigger's own UPDATE from firing it if turned on
    """CREATE TRIGGER jobs_change_seq_insert AFTER INSERT ON jobs FOR EACH ROW BEGIN
        UPDATE job_change_counter SET value = value + 1;
        UPDATE jobs SET change_seq = (SELECT value FROM job_change_counter) WHERE id = NEW.id;
    END""",
    """CREATE TRIGGER jobs_change_seq_update AFTER UPDATE ON jobs FOR EACH ROW
    WHEN NEW.change_seq IS OLD.change_seq BEGIN
        UPDATE job_change_counter SET value = value + 1;
        UPDATE jobs SET change_seq = (SELECT value FROM job_change_counter) WHERE id = NEW.id;
    END""",
    """CREATE TRIGGER jobs_change_seq_delete AFTER DELETE ON jobs FOR EACH ROW BEGIN
        UPDATE job_change_counter SET value = value + 1;
        INSERT INTO job_deletions (seq, job_id) SELECT value, OLD.id FROM job_change_counter;
    END""",
]


def upgrade() -> None:
    op.create_table(
        "job_change_counter",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("value", sa.BigInteger(), nullable=False),
    )
    op.execute("INSERT INTO job_change_counter (id, value) VALUES (1, 0)")
    op.create_table(
        "job_deletions",
        sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("job_id", sa.String(32), nullable=False),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("change_seq", sa.BigInteger(), nullable=False, server_default="0"))
        batch.create_index("ix_jobs_change_seq", ["change_seq"])
    if op.get_bind().dialect.name == "sqlite":
        for statement in _SQLITE:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in ("insert", "update", "delete"):
            op.execute(f"DROP TRIGGER jobs_change_seq_{name}")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_change_seq")
        batch.drop_column("change_seq")
    op.drop_table("job_deletions")
    op.drop_table("job_change_counter")
