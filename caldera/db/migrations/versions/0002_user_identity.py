"""users: OS uid for isolated jobs, credentials change time

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("os_uid", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("credentials_changed_at", sa.Float(), nullable=True))
        batch.create_unique_constraint("uq_users_os_uid", ["os_uid"])


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_constraint("uq_users_os_uid", type_="unique")
        batch.drop_column("credentials_changed_at")
        batch.drop_column("os_uid")
