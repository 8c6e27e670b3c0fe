"""The domain errors the API turns into HTTP answers live in ``caldera.errors`` (below the server, so that domain
packages such as ``caldera.images`` raise them without importing the server); the server's modules import them from
here as before."""

from caldera.errors import (  # noqa: F401 - re-exported
    CalderaError,
    Conflict,
    Forbidden,
    Invalid,
    InvalidFields,
    NotFound,
    Unavailable,
    field_error,
)
