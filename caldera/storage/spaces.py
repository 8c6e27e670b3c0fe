"""Which spaces exist and who may do what in them: pure rules, the database asked by ``service``.

personal:<user>   the user's own (the workspace their jobs run in): the user reads and writes, admins read
account:<name>    the account's shared space: members read and write, or only read where an admin said so;
                  admins read and write
public            everyone reads, admins write
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum, IntEnum

from caldera.storage.errors import NoAccess, PathRefused

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Kind(str, Enum):
    PERSONAL = "personal"
    ACCOUNT = "account"
    PUBLIC = "public"


class Access(IntEnum):
    NONE = 0
    READ = 1
    WRITE = 2


@dataclass(frozen=True)
class SpaceRef:
    kind: Kind
    name: str = ""  # the user or the account; "" for public

    def __str__(self) -> str:
        return self.kind.value if self.kind is Kind.PUBLIC else f"{self.kind.value}:{self.name}"


def parse_ref(text: str, me: str) -> SpaceRef:
    """``personal`` (mine), ``personal:<user>``, ``account:<name>`` or ``public``."""
    kind, _, name = text.partition(":")
    try:
        k = Kind(kind)
    except ValueError:
        raise PathRefused(f"unknown space {text[:80]!r}: personal, personal:<user>, account:<name> or public") from None
    if k is Kind.PUBLIC:
        if name:
            raise PathRefused("the public space has no name")
        return SpaceRef(k)
    if k is Kind.PERSONAL and not name:
        name = me
    if not _NAME.fullmatch(name):
        raise PathRefused(f"invalid space name {name[:80]!r}")
    return SpaceRef(k, name)


def access(ref: SpaceRef, *, username: str, admin: bool, member_mode: str | None) -> Access:
    """What a user may do in ``ref``: ``member_mode`` is None for a non-member of the account, else ro or rw."""
    if ref.kind is Kind.PERSONAL:
        if ref.name == username:
            return Access.WRITE
        return Access.READ if admin else Access.NONE
    if admin:
        return Access.WRITE
    if ref.kind is Kind.PUBLIC:
        return Access.READ
    if member_mode is None:
        return Access.NONE
    return Access.READ if member_mode == "ro" else Access.WRITE


def require(have: Access, need: Access, ref: SpaceRef) -> None:
    if have >= need:
        return
    if have is Access.NONE:
        raise NoAccess(f"you have no access to {ref}")
    raise NoAccess(f"you may read {ref} but not change it")
