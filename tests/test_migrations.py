"""The Alembic migrations produce exactly the schema the models describe, on SQLite and PostgreSQL."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from caldera.db.engine import make_engine, migrate
from caldera.db.models import Base


def test_migrations_match_models(db_url):
    engine = make_engine(db_url)
    migrate(engine)
    migrate(engine)  # idempotent
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []
