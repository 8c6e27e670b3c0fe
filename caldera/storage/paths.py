"""The one check every user-given path in a space passes: relative, no ``..``, no NUL or control character, no
component longer than a file system allows. The result is a tuple
of names; ``tree.Tree`` opens them one at a time without following symbolic links."""

from __future__ import annotations

from caldera.storage.errors import PathRefused

MAX_PATH_CHARS = 4096
MAX_NAME_BYTES = 255  # NAME_MAX of Linux file systems


def parts(path: str) -> tuple[str, ...]:
    """``path`` as the names it goes through below a space's root (empty: the root itself)."""
    if len(path) > MAX_PATH_CHARS:
        raise PathRefused(f"at most {MAX_PATH_CHARS} characters")
    if "\0" in path:
        raise PathRefused("contains a NUL byte")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise PathRefused("contains a control character (a newline, a tab)")
    if path.startswith("/"):
        raise PathRefused("must be relative to the space, not an absolute path")
    names = tuple(p for p in path.split("/") if p not in ("", "."))
    if ".." in names:
        raise PathRefused("cannot contain '..': it must stay inside the space")
    for name in names:
        try:
            size = len(name.encode())
        except UnicodeEncodeError:
            raise PathRefused("is not valid UTF-8") from None
        if size > MAX_NAME_BYTES:
            raise PathRefused(f"a name is longer than {MAX_NAME_BYTES} bytes")
    return names


def file_parts(path: str) -> tuple[str, ...]:
    """A path that names something inside the space, not the root."""
    names = parts(path)
    if not names:
        raise PathRefused("names the space itself; give a file or folder in it")
    return names
