"""job event details: the values an event's message was made from (a reason code's parameters), so the portal
renders it in the reader's language; older events keep only their English message

Revision ID: 0009
Revises: 0008
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_events") as batch:
        batch.add_column(sa.Column("details", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_events") as batch:
        batch.drop_column("details")
