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


def test_up_says_which_runtime_it_chose_and_why(tmp_path, monkeypatch) -> None:
    import caldera.server.serve
    from caldera.cli import main
    from caldera.runtime.container import probe

    monkeypatch.setattr(caldera.server.serve, "serve", lambda platform: None)  # start, say, and return
    monkeypatch.setattr(main, "_start_registry", lambda settings: None)
    monkeypatch.delenv("CALDERA_RUNTIME", raising=False)
    monkeypatch.setattr(probe, "usable", lambda cs=None: False)
    monkeypatch.setattr(probe, "problem", lambda cs=None: "podman not installed")
    runner = CliRunner()
    args = ["up", "--data-dir", str(tmp_path / "d"), "--unisolated", "--fake-gpus", "1"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "runtime: local (podman not installed)" in r.output
    r = runner.invoke(app, [*args, "--runtime", "local"])
    assert "runtime: local (--runtime)" in r.output
    monkeypatch.setattr(probe, "usable", lambda cs=None: True)
    monkeypatch.setattr(probe, "describe", lambda cs=None: "podman 4.3.1 usable, image caldera/base:bookworm")
    from caldera.runtime.default import default_choice

    assert default_choice() == ("container", "podman 4.3.1 usable, image caldera/base:bookworm")
    r = runner.invoke(app, ["up", "--help"])
    assert "--runtime" in r.output
