"""catalogue: each name's owner in a table of its own (one row per name: the first publisher wins atomically), and
each version's folder a name never reused (SQLite reuses a deleted row's id)

Revision ID: 0018
Revises: 0017
"""
import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "catalogue_names",
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.PrimaryKeyConstraint("kind", "name"),
    )
    op.execute(
        "INSERT INTO catalogue_names (kind, name, owner_id) SELECT e.kind, e.name, e.owner_id FROM catalogue_entries e "
        "WHERE e.id = (SELECT f.id FROM catalogue_entries f WHERE f.kind = e.kind AND f.name = e.name "
        "ORDER BY f.created_at, f.id LIMIT 1)"
    )
    with op.batch_alter_table("catalogue_entries") as batch:
        batch.add_column(sa.Column("folder", sa.String(32), nullable=True))
    op.execute("UPDATE catalogue_entries SET folder = CAST(id AS VARCHAR(32))")  # the folders made so far
    with op.batch_alter_table("catalogue_entries") as batch:
        batch.alter_column("folder", existing_type=sa.String(32), nullable=False)
        batch.create_unique_constraint("uq_catalogue_entries_folder", ["folder"])


def downgrade() -> None:
    with op.batch_alter_table("catalogue_entries") as batch:
        batch.drop_constraint("uq_catalogue_entries_folder", type_="unique")
        batch.drop_column("folder")
    op.drop_table("catalogue_names")
