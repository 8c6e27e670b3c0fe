"""SSH public keys: real keys of each type from ssh-keygen are accepted with ssh-keygen's own fingerprint, every
kind of bad paste is refused with its reason, keys are their owner's alone (API and pages), the CLI, and a job
finds its owner's keys as an authorized_keys file it owns."""

from __future__ import annotations

import base64
import html
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from caldera.core import ssh_keys
from caldera.db.models import SshKey
from caldera.server import api_ssh_keys
from caldera.server.web import i18n
from tests import needs
from tests.portal import browser_for, field_errors, post_form
from tests.test_browser import browser  # noqa: F401 - the chromium fixture

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen (openssh-client) not installed")

KINDS = {"ed25519": ["-t", "ed25519"], "ecdsa256": ["-t", "ecdsa", "-b", "256"],
         "ecdsa384": ["-t", "ecdsa", "-b", "384"], "ecdsa521": ["-t", "ecdsa", "-b", "521"],
         "rsa2048": ["-t", "rsa", "-b", "2048"], "rsa1024": ["-t", "rsa", "-b", "1024"]}  # fmt: skip


class Key:
    def __init__(self, path: Path):
        self.path = path
        self.public = path.with_suffix(".pub").read_text()
        self.private = path.read_text()
        out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(path) + ".pub"], capture_output=True)
        self.fingerprint = out.stdout.decode().split()[1]  # "256 SHA256:... comment (ED25519)"


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Key]:
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for kind, args in KINDS.items():
        path = d / kind
        subprocess.run(["ssh-keygen", "-q", *args, "-N", "", "-C", f"{kind}@laptop", "-f", str(path)], check=True)
        out[kind] = Key(path.with_suffix(""))
    return out


def _blob(key: Key) -> bytes:
    return base64.b64decode(key.public.split()[1])


def _line(key_type: str, blob: bytes, comment: str = "") -> str:
    return f"{key_type} {base64.b64encode(blob).decode()} {comment}".strip()


def _ssh_string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


# ---- the pure check --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind,key_type,bits",
    [("ed25519", "ssh-ed25519", 256), ("ecdsa256", "ecdsa-sha2-nistp256", 256),
     ("ecdsa384", "ecdsa-sha2-nistp384", 384), ("ecdsa521", "ecdsa-sha2-nistp521", 521),
     ("rsa2048", "ssh-rsa", 2048)],
)  # fmt: skip
def test_real_keys_of_each_type_with_ssh_keygens_fingerprint(keys, kind, key_type, bits):
    key = ssh_keys.parse(keys[kind].public)
    assert (key.key_type, key.bits, key.comment) == (key_type, bits, f"{kind}@laptop")
    assert key.fingerprint == keys[kind].fingerprint
    assert key.line == keys[kind].public.strip()
    # surrounding blank lines and spaces (a copy from a terminal) are fine; the canonical line is the same
    assert ssh_keys.parse(f"\n  {keys[kind].public}  \n\n").line == key.line


def test_bad_pastes_are_refused_with_their_reason(keys):
    ed, rsa = keys["ed25519"], keys["rsa2048"]
    ed_blob = _blob(ed)
    forged_rsa = _ssh_string(b"ssh-rsa") + _ssh_string(b"\x01\x00\x01") + _ssh_string(b"\x00" + b"\xff" * 64)
    cases = {
        ed.private: "this is a private key; paste the .pub file",
        rsa.private: "this is a private key; paste the .pub file",
        ed.public + rsa.public: "paste one key: this has several lines",
        f'from="10.0.0.1",no-pty {ed.public}': "options before the key (from=, command=, ...) are not accepted",
        f"command=/bin/sh {ed.public}": "options before the key",
        "ssh-ed25519 AAAA!!notbase64": "the key's base64 part is not valid base64",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI": "the key's base64 part is not valid base64",  # bad padding
        "ssh-ed25519": "the key's base64 part is missing",
        "": "paste a public key",
        " \n\t\n": "paste a public key",
        "ssh-dss AAAAB3NzaC1kc3M= old": "unknown key type 'ssh-dss'",
        "ssh-ed25519-cert-v01@openssh.com AAAA": "unknown key type",
        "---- BEGIN SSH2 PUBLIC KEY ----\nAAAA\n---- END SSH2 PUBLIC KEY ----": "this is an RFC 4716 key",
        ed.public.strip() + "\x1b[31m": "the key contains control characters",
        # the blob is read: its own type must be the declared one, its lengths must add up
        _line("ssh-rsa", ed_blob): "the key says ssh-rsa but its data is a ssh-ed25519 key",
        _line("ecdsa-sha2-nistp256", _blob(keys["ecdsa384"])): "but its data is a ecdsa-sha2-nistp384 key",
        _line("ssh-ed25519", ed_blob[:-5]): "the key's data is not a valid ssh-ed25519 key",
        _line("ssh-ed25519", ed_blob + b"\0"): "the key's data is not a valid ssh-ed25519 key",
        _line("ssh-ed25519", _ssh_string(b"ssh-ed25519") + _ssh_string(b"\x01" * 31)): "not a valid ssh-ed25519",
        _line("ssh-ed25519", b"\x7f\xff\xff\xff" + ed_blob[4:]): "not a valid ssh-ed25519",  # a huge length
        _line("ecdsa-sha2-nistp256", _blob(keys["ecdsa256"])[:-1]): "not a valid ecdsa-sha2-nistp256",
        _line("ssh-rsa", forged_rsa): "RSA keys need at least 2048 bits; this one has 512",
        keys["rsa1024"].public: "RSA keys need at least 2048 bits; this one has 1024",
        "ssh-ed25519 " + "A" * ssh_keys.MAX_KEY_CHARS: f"a public key is at most {ssh_keys.MAX_KEY_CHARS} characters",
    }
    for text, reason in cases.items():
        with pytest.raises(ssh_keys.SshKeyError) as exc:
            ssh_keys.parse(text)
        assert reason in str(exc.value), (text[:80], str(exc.value))


# ---- the API ---------------------------------------------------------------------------------------------------
def test_add_list_delete_and_duplicates(api, admin, keys):
    alice = api.user(admin, "alice")
    r = api.client.post("/api/v1/ssh-keys", json={"public_key": keys["ed25519"].public}, headers=alice)
    assert r.status_code == 201, r.text
    added = r.json()
    assert added["name"] == "ed25519@laptop" and added["fingerprint"] == keys["ed25519"].fingerprint
    assert added["key_type"] == "ssh-ed25519"
    r = api.client.post("/api/v1/ssh-keys", json={"public_key": keys["rsa2048"].public, "name": "work"}, headers=alice)
    assert r.status_code == 201 and r.json()["name"] == "work"

    # the same key again, even with another comment: one fingerprint once per user
    again = keys["ed25519"].public.replace("ed25519@laptop", "other")
    r = api.client.post("/api/v1/ssh-keys", json={"public_key": again}, headers=alice)
    assert r.status_code == 409 and r.json()["errors"] == [
        {"field": "public_key", "reason": "you already added this key, as 'ed25519@laptop'"}
    ]
    listed = api.client.get("/api/v1/ssh-keys", headers=alice).json()
    assert [k["name"] for k in listed] == ["ed25519@laptop", "work"]
    assert api.client.delete(f"/api/v1/ssh-keys/{added['id']}", headers=alice).status_code == 200
    assert [k["name"] for k in api.client.get("/api/v1/ssh-keys", headers=alice).json()] == ["work"]
    assert api.client.delete(f"/api/v1/ssh-keys/{added['id']}", headers=alice).status_code == 404


def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(api, admin, keys, platform):
    bodies = [
        ({"public_key": keys["ed25519"].private}, "public_key", "this is a private key; paste the .pub file"),
        ({"public_key": keys["rsa1024"].public}, "public_key", "RSA keys need at least 2048 bits; this one has 1024"),
        ({"public_key": "x" * (ssh_keys.MAX_KEY_CHARS + 1)}, "public_key", "String should have at most 16384"),
        ({"public_key": keys["ed25519"].public, "name": "n" * 101}, "name", "String should have at most 100"),
        ({"public_key": keys["ed25519"].public, "name": "a\x1b[2Jb"}, "name", "the name contains control characters"),
        ({"public_key": keys["ed25519"].public, "name": "two\nlines"}, "name", "the name contains control characters"),
        ({"name": "no key"}, "public_key", "Field required"),
        ({"public_key": 42}, "public_key", "Input should be a valid string"),
    ]
    for body, field, reason in bodies:
        r = api.client.post("/api/v1/ssh-keys", json=body, headers=admin)
        assert r.status_code == 400, (body, r.text)
        errors = r.json()["errors"]
        assert errors[0]["field"] == field and errors[0]["reason"].startswith(reason), errors
    with platform.session() as db:
        assert db.query(SshKey).count() == 0


def test_a_comment_too_long_for_a_name_is_cut_and_kept_whole_in_the_key(api, admin, keys):
    line = keys["ed25519"].public.strip().rsplit(" ", 1)[0] + " " + "c" * 300
    r = api.client.post("/api/v1/ssh-keys", json={"public_key": line}, headers=admin)
    assert r.status_code == 201 and r.json()["name"] == "c" * 100 and r.json()["public_key"] == line


def test_the_number_of_keys_is_limited(api, admin, platform, monkeypatch, keys):
    monkeypatch.setattr(api_ssh_keys, "MAX_KEYS_PER_USER", 2)
    for kind in ("ed25519", "ecdsa256"):
        assert api.client.post("/api/v1/ssh-keys", json={"public_key": keys[kind].public}, headers=admin).is_success
    r = api.client.post("/api/v1/ssh-keys", json={"public_key": keys["ecdsa384"].public}, headers=admin)
    assert r.status_code == 409 and "you have 2 SSH keys, the most one may keep" in r.json()["detail"]
    with platform.session() as db:
        assert db.query(SshKey).count() == 2


def test_keys_are_their_owners_alone(api, admin, keys):
    alice, bob = api.user(admin, "alice"), api.user(admin, "bob")
    key = api.client.post("/api/v1/ssh-keys", json={"public_key": keys["ed25519"].public}, headers=alice).json()
    assert api.client.get("/api/v1/ssh-keys", headers=bob).json() == []
    assert api.client.get("/api/v1/ssh-keys", headers=admin).json() == []  # not even an admin sees them
    for who in (bob, admin):
        r = api.client.delete(f"/api/v1/ssh-keys/{key['id']}", headers=who)
        assert r.status_code == 404 and r.json()["detail"] == "no such SSH key"
    for bad_id in ("0", "-1", str(2**31), "abc"):
        assert api.client.delete(f"/api/v1/ssh-keys/{bad_id}", headers=alice).status_code == 400
    assert [k["id"] for k in api.client.get("/api/v1/ssh-keys", headers=alice).json()] == [key["id"]]
    # bob may add the same public key himself (it is his to prove): unique per user, not globally
    r = api.client.post("/api/v1/ssh-keys", json={"public_key": keys["ed25519"].public}, headers=bob)
    assert r.status_code == 201
    assert api.client.get("/api/v1/ssh-keys").status_code == 401


# ---- the page --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_tokens_page_lists_adds_and_deletes_keys(api, admin, keys):
    api.user(admin, "alice")
    me = browser_for(api.client, "alice", "password-123")
    assert "No SSH keys yet." in me.get("/tokens").text
    r = post_form(me, "/ssh-keys", {"name": "", "public_key": keys["ecdsa256"].public})
    assert r.status_code == 303 and r.headers["location"] == "/tokens#ssh-keys"
    listing = me.get("/tokens").text
    assert keys["ecdsa256"].fingerprint in listing and "ecdsa256@laptop" in listing
    key_id = re.search(r'<tr data-ssh-key="(\d+)">', listing).group(1)

    # refused: the reason is next to its field, the text typed is kept; a private key is not sent back
    r = post_form(me, "/ssh-keys", {"name": "mine", "public_key": keys["rsa1024"].public})
    assert r.status_code == 400
    assert field_errors(r.text, "public_key") == ["RSA keys need at least 2048 bits; this one has 1024"]
    assert keys["rsa1024"].public.split()[1] in r.text and 'value="mine"' in r.text
    r = post_form(me, "/ssh-keys", {"name": "", "public_key": keys["ed25519"].private})
    assert field_errors(r.text, "public_key") == ["this is a private key; paste the .pub file"]
    assert "PRIVATE KEY" not in r.text and keys["ed25519"].private.splitlines()[1] not in r.text
    me.cookies.set(i18n.LANG_COOKIE, "zh")
    r = post_form(me, "/ssh-keys", {"name": "", "public_key": keys["ecdsa256"].public})
    shown = [html.unescape(e) for e in field_errors(r.text, "public_key")]
    assert shown == ["你已添加过此密钥，名称为 'ecdsa256@laptop'"]
    assert "SSH 密钥" in r.text

    # attacks: a post without the CSRF token, another user's delete
    r = me.post("/ssh-keys", data={"public_key": keys["ed25519"].public}, follow_redirects=False)
    assert r.status_code == 403
    r = me.post(f"/ssh-keys/{key_id}/delete", follow_redirects=False)
    assert r.status_code == 403
    bob = api.user(admin, "bob")
    bob_page = browser_for(api.client, "bob", "password-123")
    assert post_form(bob_page, f"/ssh-keys/{key_id}/delete", {}).status_code == 404
    assert keys["ecdsa256"].fingerprint not in bob_page.get("/tokens").text
    alice = api.login("alice", "password-123")
    assert [k["name"] for k in api.client.get("/api/v1/ssh-keys", headers=alice).json()] == ["ecdsa256@laptop"]
    assert api.client.get("/api/v1/ssh-keys", headers=bob).json() == []

    assert post_form(me, f"/ssh-keys/{key_id}/delete", {}).status_code == 303
    assert api.client.get("/api/v1/ssh-keys", headers=alice).json() == []


# ---- the CLI ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_add_list_remove(server, tmp_path, monkeypatch, keys):
    from typer.testing import CliRunner

    from caldera.cli.main import app as cli

    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(tmp_path / "cli"))
    runner = CliRunner()
    assert runner.invoke(cli, ["login", "--url", server.url, "-u", "admin", "-p", "admin-password"]).exit_code == 0
    pub = str(keys["ed25519"].path) + ".pub"
    r = runner.invoke(cli, ["ssh-keys", "add", pub, "--name", "laptop"])
    assert r.exit_code == 0 and keys["ed25519"].fingerprint in r.output, r.output
    r = runner.invoke(cli, ["ssh-keys", "add", pub])
    assert r.exit_code == 1 and "you already added this key, as 'laptop'" in r.output, r.output
    r = runner.invoke(cli, ["ssh-keys", "add", str(keys["ed25519"].path)])  # the private key file
    assert r.exit_code == 1 and "this is a private key; paste the .pub file" in r.output, r.output
    assert "PRIVATE" not in r.output
    r = runner.invoke(cli, ["ssh-keys", "add", str(tmp_path / "missing.pub")])
    assert r.exit_code != 0
    r = runner.invoke(cli, ["ssh-keys", "list"])
    assert r.exit_code == 0 and "laptop" in r.output and keys["ed25519"].fingerprint in r.output, r.output
    key_id = re.search(r"^\s*(\d+)\s+SHA256:\S+\s+ssh-ed25519\s.*\slaptop$", r.output, re.M).group(1)
    r = runner.invoke(cli, ["ssh-keys", "remove", key_id])
    assert r.exit_code == 0 and "removed" in r.output, r.output
    r = runner.invoke(cli, ["ssh-keys", "remove", key_id])
    assert r.exit_code == 1 and "no such SSH key" in r.output
    assert "laptop" not in runner.invoke(cli, ["ssh-keys", "list"]).output


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_key_form_in_the_browser(server, browser, keys):  # noqa: F811
    """Paste a private key by mistake (the reason shows next to the field), then the .pub; delete it again."""
    from tests.test_portal_browser import _shot, signed_in_page

    page, violations = signed_in_page(browser, server, "admin", "admin-password")
    page.goto(server.url + "/tokens#ssh-keys")
    page.fill("#add-ssh-key textarea[name=public_key]", keys["ed25519"].private)
    page.click("#add-ssh-key button[type=submit]")
    error = page.wait_for_selector('#add-ssh-key .field-err[data-field="public_key"]')
    assert error.inner_text() == "this is a private key; paste the .pub file"
    assert page.input_value("#add-ssh-key textarea[name=public_key]") == ""  # not sent back
    page.fill("#add-ssh-key input[name=name]", "laptop")
    page.fill("#add-ssh-key textarea[name=public_key]", keys["ed25519"].public)
    page.click("#add-ssh-key button[type=submit]")
    row = page.wait_for_selector("#ssh-key-list tr[data-ssh-key]")
    assert "laptop" in row.inner_text() and keys["ed25519"].fingerprint in row.inner_text()
    _shot(page, "ssh-keys")
    row.query_selector("button[type=submit]").click()
    page.wait_for_selector("#ssh-key-list:has-text('No SSH keys yet.')")
    assert not violations, violations


# ---- a job gets its owner's keys -------------------------------------------------------------------------------
def test_a_job_finds_its_owners_keys_in_a_file_it_owns(api, admin, keys, platform):
    from tests.test_runs import _log, _submit, _until

    alice, bob = api.user(admin, "alice"), api.user(admin, "bob")
    for kind in ("ed25519", "rsa2048"):
        api.client.post("/api/v1/ssh-keys", json={"public_key": keys[kind].public}, headers=alice)
    api.client.post("/api/v1/ssh-keys", json={"public_key": keys["ecdsa256"].public}, headers=bob)
    script = 'f="$CALDERA_SSH_AUTHORIZED_KEYS"; stat -c "mode=%a uid=%u" "$f"; id -u; cat "$f"'
    jid = _submit(api, alice, name="keys", command=["sh", "-c", script])
    assert _until(api, alice, jid, {"Succeeded", "Failed"})["state"] == "Succeeded", _log(api, alice, jid)
    lines = _log(api, alice, jid).splitlines()
    job_uid = lines[1]
    assert lines[0] == f"mode=600 uid={job_uid}"
    if os.geteuid() == 0:  # run as its owner: the file is the owner's uid, not root's
        assert job_uid != "0"
    assert lines[2:] == [keys["ed25519"].public.strip(), keys["rsa2048"].public.strip()]  # bob's key is not there

    # no keys: no file and no variable
    jid = _submit(api, admin, name="none", command=["sh", "-c", 'echo "[${CALDERA_SSH_AUTHORIZED_KEYS-unset}]"'])
    assert _until(api, admin, jid, {"Succeeded", "Failed"})["state"] == "Succeeded"
    assert _log(api, admin, jid).strip() == "[unset]"


def test_a_container_job_finds_them_too(tmp_path, keys):
    """The container runtime mounts the attempt's scratch at the same path, so the variable means the same inside."""
    from caldera.config import FakeGpu, Settings
    from caldera.core.spec import JobSpec
    from caldera.runtime.base import LaunchRequest, Phase, RunAs
    from caldera.runtime.container.runtime import ContainerRuntime
    from tests.conftest import traversable
    from tests.runtime.conftest import wait_terminal

    needs.podman()
    settings = Settings(data_dir=traversable(tmp_path) / "data", node_name="ctr-node", fake_gpus=[FakeGpu()] * 1)
    rt = ContainerRuntime(settings)
    alice = RunAs("alice", 201_002, 201_002)
    home = settings.workspaces / "alice"
    script = 'f="$CALDERA_SSH_AUTHORIZED_KEYS"; stat -c "mode=%a uid=%u" "$f"; cat "$f"'
    spec = JobSpec.model_validate({"name": "keys", "command": ["sh", "-c", script]})
    authorized = keys["ed25519"].public
    req = LaunchRequest("ct-keys", 1, spec, (), home / "jobs" / "ct-keys", run_as=alice, home=home,
                        authorized_keys=authorized)  # fmt: skip
    h = rt.launch(req)
    obs = wait_terminal(rt, h, timeout=60)
    out = b"".join(rt.logs(h)).decode()
    assert obs.phase is Phase.SUCCEEDED, out
    assert out.splitlines() == ["mode=600 uid=201002", authorized.strip()]
