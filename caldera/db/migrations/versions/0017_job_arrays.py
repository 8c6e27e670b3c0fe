"""job arrays: one submission of many tasks, each a job with its array and index

Revision ID: 0017
Revises: 0016
"""
import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_arrays",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("expression", sa.String(256), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("submitted_at", sa.Float(), nullable=False),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("array_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("array_index", sa.Integer(), nullable=True))
        batch.create_foreign_key("fk_jobs_array_id", "job_arrays", ["array_id"], ["id"], ondelete="CASCADE")
        batch.create_index("ix_jobs_array_id", ["array_id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_array_id")
        batch.drop_constraint("fk_jobs_array_id", type_="foreignkey")
        batch.drop_column("array_index")
        batch.drop_column("array_id")
    op.drop_table("job_arrays")
