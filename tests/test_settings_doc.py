"""docs/settings.md is the list of every setting the code reads, with a description each."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from caldera.cli.main import app
from caldera.settings_doc import markdown, rows

DOC = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def test_every_setting_is_described() -> None:
    missing = [var for _, var, _, text in rows() if not text]
    assert not missing, f"settings without a description: {missing}"


def test_the_docs_list_is_the_codes_list() -> None:
    printed = CliRunner().invoke(app, ["settings"]).output
    assert printed == markdown()
    assert markdown() in DOC.read_text(), "docs/settings.md is stale: regenerate it with `caldera settings`"
    for var in ("CALDERA_LAB_PORT", "CALDERA_CONFIG_DIR", "CALDERA_CONTAINER_IMAGE", "CALDERA_KUBERNETES_CONTEXT"):
        assert f"`{var}`" in printed
