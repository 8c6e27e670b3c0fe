"""`caldera up` with bad settings says which one is wrong and exits 1, before it starts anything."""

from __future__ import annotations

from typer.testing import CliRunner

from caldera.cli.main import app


def test_up_names_a_bad_setting_instead_of_a_traceback(tmp_path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["up", "--data-dir", str(tmp_path)], env={"CALDERA_SHARING_PAIR_ON_FREE": "true"})
    said = " ".join(r.output.split())  # rich wraps lines at the terminal's width
    assert r.exit_code == 1
    assert "CALDERA_SHARING_PAIR_ON_FREE needs CALDERA_SHARING_DRAIN_FOR_BLOCKED" in said
    assert "Traceback" not in said
    r = runner.invoke(app, ["up", "--data-dir", str(tmp_path)], env={"CALDERA_LOGIN_WINDOW_S": "soon"})
    assert r.exit_code == 1 and "login_window_s:" in r.output
    assert "soon" not in r.output  # the message, never the value (a bad value may be a secret)
    assert not (tmp_path / "caldera.db").exists()  # nothing was started
