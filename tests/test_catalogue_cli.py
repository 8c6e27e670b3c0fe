"""`caldera data` against a real server process: import a URL with progress (from a local server an admin allowed),
a refused import's reason, publish a folder (waiting for its copy, or not), find it, delete it; a version copying as
the server is killed is copied again at its start; a job's output refused for a job not the user's."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ServerProcess, free_port, server_env, traversable, wait_for
from tests.test_catalogue import DATA, files_server  # noqa: F401 - fixture
from tests.test_server_process import cli


@pytest.fixture
def server(tmp_path, db_url):
    env = {**server_env(tmp_path, db_url), "CALDERA_STORAGE_IMPORT_ALLOWED_NETWORKS": "127.0.0.1/32",
           "CALDERA_CATALOGUE_COPY_BYTES_PER_S": str(len(DATA) // 8)}  # a publish's copy takes 8 s  # fmt: skip
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_data_cli_publishes_finds_and_imports(server, files_server, tmp_path):  # noqa: F811
    cli(server, "login", "--url", server.url, "-u", "admin", "-p", "admin-password")
    cli(server, "files", "mkdir", "weights")
    out = cli(server, "data", "import", files_server + "/data", "weights/base.bin")
    assert "imported 1.0 MiB to personal:admin:weights/base.bin" in out.stdout
    refused = cli(server, "data", "import", "http://10.0.0.1/x", "x.bin", check=False)
    assert refused.returncode == 1 and "non-public" in refused.stderr
    cli(server, "data", "publish", "base-model", "v1", "--path", "weights", "--kind", "model", "-d", "a start",
        "--framework", "pytorch", "--visibility", "public")  # fmt: skip
    (row,) = json.loads(cli(server, "data", "ls", "pytorch", "-o", "json").stdout)
    assert (row["ref"], row["kind"], row["size_bytes"], row["owner"]) == ("base-model@v1", "model", len(DATA), "admin")
    assert "deleted model base-model@v1" in cli(server, "data", "rm", "base-model@v1", "-k", "model").stdout
    # --no-wait: at once, copying; a server killed mid-copy copies it again as it starts
    row = json.loads(
        cli(server, "data", "publish", "later", "v1", "--path", "weights", "--no-wait", "-o", "json").stdout
    )
    assert (row["state"], row["ref"]) == ("copying", "later@v1"), row
    server.kill()
    server.start()
    ready = wait_for(lambda: (e := json.loads(cli(server, "data", "show", "later@v1", "-o", "json").stdout))["state"]
                     != "copying" and e, 30, what="later@v1 copied again")  # fmt: skip
    assert (ready["state"], ready["size_bytes"]) == ("ready", len(DATA)), ready
    # a job's output: the job is checked by the server (its owner's, succeeded), so an unknown one is refused
    refused = cli(server, "data", "publish", "out", "v1", "--kind", "model", "--from-job", "nosuchjob", check=False)
    assert refused.returncode == 1 and "no job 'nosuchjob' of yours" in refused.stderr, refused.stderr
