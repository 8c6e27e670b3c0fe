"""jobs.change_seq: a counter bumped by every write of a job row, so the live loop reads only the rows changed
since its last cycle (caldera/server/snapshot_jobs.py); job_deletions: the jobs deleted, with the counter's value

Revision ID: 0022
Revises: 0021

Bumped by database triggers, not by the ORM: an ORM event (before_update) misses Core ``update()`` statements,
bulk writes, foreign-key cascades (deleting an array deletes its jobs) and any SQL written by hand, and a column's
``onupdate`` misses the last two. A trigger sees every write of the table, whoever makes it.

The counter is one row (job_change_counter) updated in the writing transaction, not a sequence: its row lock (on
SQLite the database's one write lock) is held until the transaction ends, so transactions that write jobs take
their values in the order they commit. A reader that has seen every row up to value N can then never see a row
committed later with a value of N or less, which a sequence (values taken at the write, commits in any order)
would allow. The cost on PostgreSQL: transactions that write jobs wait for each other, as on SQLite.
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
    """CREATE FUNCTION jobs_change_seq_bump() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE job_change_counter SET value = value + 1 RETURNING value INTO NEW.change_seq;
        RETURN NEW;
    END $$""",
    """CREATE FUNCTION jobs_change_seq_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE bumped BIGINT;
    BEGIN
        UPDATE job_change_counter SET value = value + 1 RETURNING value INTO bumped;
        INSERT INTO job_deletions (seq, job_id) VALUES (bumped, OLD.id);
        RETURN OLD;
    END $$""",
    """CREATE TRIGGER jobs_change_seq_write BEFORE INSERT OR UPDATE ON jobs
        FOR EACH ROW EXECUTE FUNCTION jobs_change_seq_bump()""",
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
        sa.Column("job_id", sa.String(32), nullable=False),
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
        op.execute("DROP FUNCTION jobs_change_seq_bump()")
        op.execute("DROP FUNCTION jobs_change_seq_deleted()")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_change_seq")
        batch.drop_column("change_seq")
    op.drop_table("job_deletions")
    op.drop_table("job_change_counter")
