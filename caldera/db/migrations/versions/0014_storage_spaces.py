"""storage spaces: quotas and usage counters, members' read-only modes, resumable uploads under way

Revision ID: 0014
Revises: 0013
"""
import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "storage_spaces",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("quota_bytes", sa.BigInteger(), nullable=True),
        sa.Column("quota_files", sa.BigInteger(), nullable=True),
        sa.Column("used_bytes", sa.BigInteger(), nullable=False),
        sa.Column("used_files", sa.BigInteger(), nullable=False),
        sa.Column("reconciled_at", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("kind", "name"),
    )
    op.create_table(
        "storage_member_modes",
        sa.Column(
            "space_id", sa.Integer(), sa.ForeignKey("storage_spaces.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("mode", sa.String(8), nullable=False),
    )
    op.create_table(
        "storage_uploads",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "space_id", sa.Integer(), sa.ForeignKey("storage_spaces.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_storage_uploads_space_id", "storage_uploads", ["space_id"])


def downgrade() -> None:
    op.drop_index("ix_storage_uploads_space_id", "storage_uploads")
    op.drop_table("storage_uploads")
    op.drop_table("storage_member_modes")
    op.drop_table("storage_spaces")
