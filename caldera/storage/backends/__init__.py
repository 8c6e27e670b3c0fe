"""Storage backends by name (setting ``storage_backend``), entry points of ``caldera.storage_backends``."""
