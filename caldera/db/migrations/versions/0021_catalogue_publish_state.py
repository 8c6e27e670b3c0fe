"""catalogue_entries: a version is published in the background: copying (its size and files so far), ready, or
failed with the reason; what its copy left out

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("catalogue_entries") as batch:
        batch.add_column(sa.Column("state", sa.String(16), nullable=False, server_default="ready"))
        batch.add_column(sa.Column("error", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("left_out", sa.JSON(), nullable=False, server_default=sa.text("'[]'")))
        batch.create_index("ix_catalogue_entries_state", ["state"])


def downgrade() -> None:
    with op.batch_alter_table("catalogue_entries") as batch:
        batch.drop_index("ix_catalogue_entries_state")
        batch.drop_column("left_out")
        batch.drop_column("error")
        batch.drop_column("state")
