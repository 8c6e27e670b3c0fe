"""jobs: the spec's publish once a job has succeeded, pending until its folder is a model version, and its outcome

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("publish_state", sa.String(16), nullable=True))
        batch.add_column(sa.Column("publish_result", sa.JSON(), nullable=True))
        batch.create_index("ix_jobs_publish_state", ["publish_state"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_publish_state")
        batch.drop_column("publish_result")
        batch.drop_column("publish_state")
