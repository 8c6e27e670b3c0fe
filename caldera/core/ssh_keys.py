"""OpenSSH public keys as users paste them: one ``type base64 [comment]`` line, checked down to the key's own bytes.

The base64 part is the key blob of RFC 4253 (strings and mpints, each a 4-byte length and its bytes). The blob names
its type again, and that must be the declared one: sshd reads the blob, so a line whose two types differ, whose
lengths do not add up, or whose RSA modulus is short would be a key the user thinks they have and do not. What this
module accepts, sshd accepts in an authorized_keys file.

Standard library only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

MAX_KEY_CHARS = 16 * 1024  # an RSA-16384 public key is about 2,800 characters; anything longer is not one key
MAX_NAME_CHARS = 100
MIN_RSA_BITS = 2048
MAX_RSA_BITS = 16384  # OpenSSH's own limit

# declared type -> (ECDSA curve name in the blob, bytes of one coordinate); None for the other types
_ECDSA = {"ecdsa-sha2-nistp256": ("nistp256", 32), "ecdsa-sha2-nistp384": ("nistp384", 48),
          "ecdsa-sha2-nistp521": ("nistp521", 66)}  # fmt: skip
KEY_TYPES = ("ssh-ed25519", *_ECDSA, "ssh-rsa")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class SshKeyError(ValueError):
    """A key that cannot be accepted; the message says why in words a user can act on."""


@dataclass(frozen=True)
class PublicKey:
    key_type: str
    blob: bytes
    comment: str
    bits: int

    @property
    def fingerprint(self) -> str:
        """As ``ssh-keygen -l`` prints it: SHA256 of the blob, base64 without padding."""
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.blob).digest()).decode().rstrip("=")

    @property
    def line(self) -> str:
        """The key in its canonical one-line form (what an authorized_keys file holds)."""
        text = f"{self.key_type} {base64.b64encode(self.blob).decode()}"
        return f"{text} {self.comment}" if self.comment else text


class _Damaged(Exception):
    """The blob's bytes do not make a key of its type (cut short, extra bytes, a wrong length)."""


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def string(self) -> bytes:
        if self.pos + 4 > len(self.data):
            raise _Damaged
        n = int.from_bytes(self.data[self.pos : self.pos + 4], "big")
        start, self.pos = self.pos + 4, self.pos + 4 + n
        if self.pos > len(self.data):
            raise _Damaged
        return self.data[start : self.pos]

    def mpint(self) -> int:
        raw = self.string()
        if raw and raw[0] & 0x80:  # negative
            raise _Damaged
        return int.from_bytes(raw, "big")

    def end(self) -> None:
        if self.pos != len(self.data):
            raise _Damaged


def parse(text: str) -> PublicKey:
    """The one key in ``text`` (an id_*.pub file's content), or SshKeyError."""
    if len(text) > MAX_KEY_CHARS:
        raise SshKeyError(f"a public key is at most {MAX_KEY_CHARS} characters")
    if "PRIVATE KEY" in text:
        raise SshKeyError("this is a private key; paste the .pub file")
    if "BEGIN SSH2 PUBLIC KEY" in text:
        raise SshKeyError("this is an RFC 4716 key; paste the OpenSSH form (ssh-keygen -i -f FILE prints it)")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise SshKeyError("paste a public key")
    if len(lines) > 1:
        raise SshKeyError("paste one key: this has several lines")
    line = lines[0]
    if _CONTROL.search(line):
        raise SshKeyError("the key contains control characters")
    parts = line.split(None, 2)
    declared = parts[0]
    if declared not in KEY_TYPES:
        if any(p in KEY_TYPES for p in line.split()):
            raise SshKeyError("options before the key (from=, command=, ...) are not accepted; paste the key alone")
        raise SshKeyError(f"unknown key type {declared[:40]!r}; one of {', '.join(KEY_TYPES)}")
    if len(parts) < 2:
        raise SshKeyError("the key's base64 part is missing")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise SshKeyError("the key's base64 part is not valid base64") from None
    comment = parts[2].strip() if len(parts) == 3 else ""
    return PublicKey(declared, blob, comment, _bits(declared, blob))


def _bits(declared: str, blob: bytes) -> int:
    """The key's size, once its blob is checked against ``declared``."""
    r = _Reader(blob)
    try:
        inner = r.string().decode("ascii", "replace")
        if inner != declared:
            raise SshKeyError(f"the key says {declared} but its data is a {inner[:40]} key")
        bits = _checked_bits(declared, r)
        r.end()
    except _Damaged:
        raise SshKeyError(f"the key's data is not a valid {declared} key") from None
    if declared == "ssh-rsa" and bits < MIN_RSA_BITS:
        raise SshKeyError(f"RSA keys need at least {MIN_RSA_BITS} bits; this one has {bits}")
    if declared == "ssh-rsa" and bits > MAX_RSA_BITS:
        raise SshKeyError(f"RSA keys have at most {MAX_RSA_BITS} bits; this one has {bits}")
    return bits


def _checked_bits(declared: str, r: _Reader) -> int:
    """The rest of the blob after its type: ed25519's 32 bytes, ECDSA's curve and point, RSA's e and n."""
    if declared == "ssh-ed25519":
        if len(r.string()) != 32:
            raise _Damaged
        return 256
    if declared in _ECDSA:
        curve, size = _ECDSA[declared]
        if r.string() != curve.encode():
            raise _Damaged
        point = r.string()
        if len(point) != 1 + 2 * size or point[0] != 4:  # only uncompressed points, as OpenSSH
            raise _Damaged
        return int(curve.removeprefix("nistp"))
    e, n = r.mpint(), r.mpint()
    if e < 3 or e % 2 == 0:
        raise _Damaged
    return n.bit_length()


def key_name(name: str, key: PublicKey) -> str:
    """What the key is called in listings: the name given, else its comment, else its type."""
    if len(name) > MAX_NAME_CHARS:
        raise SshKeyError(f"a name is at most {MAX_NAME_CHARS} characters")
    if _CONTROL.search(name) or "\n" in name or "\t" in name:
        raise SshKeyError("the name contains control characters")
    chosen = name.strip() or key.comment or key.key_type
    return chosen[:MAX_NAME_CHARS]
