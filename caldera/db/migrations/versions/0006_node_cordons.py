"""node cordons: nodes an admin took out of scheduling, with who, when and why

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_cordons",
        sa.Column("node", sa.String(128), primary_key=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("by", sa.String(64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("drained", sa.Boolean(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("node_cordons")
