"""governance: account admins, what governance recorded about each job, extend and lock requests

Revision ID: 0013
Revises: 0011
"""
import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("account_members") as batch:
        batch.add_column(sa.Column("admin", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table(
        "job_governance",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("idle_warned_at", sa.Float(), nullable=True),
        sa.Column("idle_flagged_at", sa.Float(), nullable=True),
        sa.Column("limit_warned_at", sa.Float(), nullable=True),
        sa.Column("locked_until", sa.Float(), nullable=True),
        sa.Column("extended_s", sa.Float(), nullable=False, server_default="0"),
        sa.Column("snapshot_image", sa.String(32), nullable=True),
        sa.Column("pending_stop", sa.JSON(), nullable=True),
        sa.Column("advice", sa.JSON(), nullable=True),
    )
    op.create_table(
        "governance_requests",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("seconds", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("decided_by", sa.String(64), nullable=True),
        sa.Column("decided_at", sa.Float(), nullable=True),
        sa.Column("note", sa.Text(), nullable=False, server_default=""),
    )
    op.create_index("ix_governance_requests_state", "governance_requests", ["state"])
    op.create_index("ix_governance_requests_job_id", "governance_requests", ["job_id"])


def downgrade() -> None:
    op.drop_table("governance_requests")
    op.drop_table("job_governance")
    with op.batch_alter_table("account_members") as batch:
        batch.drop_column("admin")
