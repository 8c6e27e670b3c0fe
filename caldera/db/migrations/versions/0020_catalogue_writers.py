"""catalogue_names: the users and accounts a name's owner lets publish versions under it

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("catalogue_names") as batch:
        batch.add_column(sa.Column("writers", sa.JSON(), nullable=False, server_default=sa.text("'[]'")))


def downgrade() -> None:
    with op.batch_alter_table("catalogue_names") as batch:
        batch.drop_column("writers")
