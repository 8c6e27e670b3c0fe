"""jobs.change_seq: a value set by every write of a job row, so the live loop reads only the rows changed since its
last cycle (caldera/server/snapshot_jobs.py); job_deletions: the jobs deleted, with the value a write would set

Revision ID: 0022
Revises: 0021

Set by database triggers, not by the ORM: an ORM event (before_update) misses Core ``update()`` statements,
bulk writes, foreign-key cascades (deleting an array deletes its jobs) and any SQL written by hand, and a column's
``onupdate`` misses the last two. A trigger sees every write of the table, whoever makes it.

On SQLite the value is a counter, one row (job_change_counter) updated in the writing transaction, not a sequence:
SQLite's one write lock, held until the transaction ends, makes transactions that write jobs take their values in
the order they commit. A reader that has seen every row up to value N can then never see a row committed later with
a value of N or less, which a sequence (values taken at the write, commits in any order) would allow.

On PostgreSQL the value is the writing transaction's id (``pg_current_xact_id()``), which takes no lock. A counter
row there would be a lock taken at a transaction's first job write, after that job's row lock: a transaction holding
it (the loop's cycle, having written job Y) that then writes job X, and one that has locked X and waits for it (a
cancel of X), deadlock (tests/test_loop_snapshot_cache.py). Transaction ids are not in the order of commit, so the
reader keeps, instead of the highest value it read, its snapshot's xmin: a row it could not see was written by a
transaction at or above it, and rows from that value up are read again next time (caldera/server/snapshot_jobs.py).
A transaction deleting many jobs records them all with its id: job_deletions' key is (seq, job_id).

A later migration that rebuilds ``jobs`` on SQLite (alembic's batch "move and copy") drops these triggers with the
old table: it must create them again (``_SQLITE``), or the loop's reads miss writes until its full read.
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

_POSTGRESQL = [
    """CREATE FUNCTION jobs_change_seq_written() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        NEW.change_seq := pg_current_xact_id()::text::bigint;
        RETURN NEW;
    END $$""",
    """CREATE FUNCTION jobs_change_seq_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO job_deletions (seq, job_id) VALUES (pg_current_xact_id()::text::bigint, OLD.id);
        RETURN OLD;
    END $$""",
    """CREATE TRIGGER jobs_change_seq_write BEFORE INSERT OR UPDATE ON jobs
        FOR EACH ROW EXECUTE FUNCTION jobs_change_seq_written()""",
    """CREATE TRIGGER jobs_change_seq_delete AFTER DELETE ON jobs
        FOR EACH ROW EXECUTE FUNCTION jobs_change_seq_deleted()""",
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
        sa.Column("job_id", sa.String(32), primary_key=True),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("change_seq", sa.BigInteger(), nullable=False, server_default="0"))
        batch.create_index("ix_jobs_change_seq", ["change_seq"])
    for statement in _SQLITE if op.get_bind().dialect.name == "sqlite" else _POSTGRESQL:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in ("insert", "update", "delete"):
            op.execute(f"DROP TRIGGER jobs_change_seq_{name}")
    else:
        op.execute("DROP TRIGGER jobs_change_seq_write ON jobs")
        op.execute("DROP TRIGGER jobs_change_seq_delete ON jobs")
        op.execute("DROP FUNCTION jobs_change_seq_written()")
        op.execute("DROP FUNCTION jobs_change_seq_deleted()")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_change_seq")
        batch.drop_column("change_seq")
    op.drop_table("job_deletions")
    op.drop_table("job_change_counter")
