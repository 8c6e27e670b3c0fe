"""What of the platform's key list reaches OpenSSH's authorized_keys file in a job (``job_sshd.public_keys``):
only ``type base64`` of real OpenSSH public keys, never an option, a comment or a second line smuggled in."""

from __future__ import annotations

import subprocess
from pathlib import Path

from caldera.runtime.job_sshd import public_keys
from tests import needs


def _keygen(tmp_path: Path, kind: str) -> str:
    needs.program("ssh-keygen", "openssh-client")
    path = tmp_path / f"id_{kind}"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "me@laptop", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text()


def test_only_openssh_keys_pass_and_only_their_type_and_blob(tmp_path) -> None:
    ed, ecdsa = _keygen(tmp_path, "ed25519"), _keygen(tmp_path, "ecdsa")
    kind, blob, _ = ed.split()
    forged = f"ssh-rsa {blob}"  # an ed25519 blob claiming another type
    text = "\n".join([
        ed.strip(),
        f'command="rm -rf ~",no-pty {ed.strip()}',  # options first: not a key line
        ecdsa.strip(),
        forged,
        f"{kind} {blob[:-4]}!!!!",  # not base64
        f"{kind}",
        "PasswordAuthentication yes",
    ])  # fmt: skip
    assert public_keys(text) == [f"{kind} {blob}", " ".join(ecdsa.split()[:2])]
