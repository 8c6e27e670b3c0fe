"""environments: the admins' catalogue of the platform's images (bases for the build form, ready environments for
jobs), seeded with what `caldera images bootstrap` makes

Revision ID: 0010
Revises: 0009
"""
import time

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_SEED = (  # the images `caldera images bootstrap` makes (caldera/images/ready.py); admins add or remove others
    ("caldera/default:bookworm", "ready", "3.11", "none", "JupyterLab, ipykernel, numpy"),
    ("caldera/pytorch:bookworm", "ready", "3.11", "12.x",
     "JupyterLab, PyTorch with its CUDA 12 wheels (runs on the CPU where no GPU is)"),
    ("caldera/base:bullseye", "base", "3.9", "none", "Debian 11, python3"),
    ("caldera/base:bookworm", "base", "3.11", "none", "Debian 12, python3"),
    ("caldera/base:trixie", "base", "3.13", "none", "Debian 13, python3"),
)  # fmt: skip


def upgrade() -> None:
    table = op.create_table(
        "environments",
        sa.Column("ref", sa.String(128), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("python", sa.String(16), nullable=False),
        sa.Column("cuda", sa.String(16), nullable=False),
        sa.Column("inside", sa.Text(), nullable=False),
        sa.Column("added_by", sa.String(64), nullable=False),
        sa.Column("added_at", sa.Float(), nullable=False),
    )
    now = time.time()
    op.bulk_insert(
        table,
        [dict(zip(("ref", "kind", "python", "cuda", "inside"), row), added_by="caldera", added_at=now) for row in _SEED],
    )


def downgrade() -> None:
    op.drop_table("environments")
