"""Images users make: the OCI registry they live in, the catalogue of them, builds from a form, snapshots."""
