"""Imports of a Hugging Face-style repository: ``hf://<owner>/<repo>[@<revision>]`` (a model) or
``hf://datasets/<owner>/<repo>[@<revision>]``, from the mirror an admin configured (``huggingface_mirror_url``; none:
refused). The mirror is asked as the Hub is: ``GET {mirror}/api/models/{owner}/{repo}/revision/{rev}`` (``datasets``
for a dataset) lists the files (``siblings``, each an ``rfilename``), and each file comes from
``{mirror}/[datasets/]{owner}/{repo}/resolve/{rev}/{rfilename}``: every one an import from URL of its own
(caldera/storage/fetch.py: the same outbound checks, redirects included, part files, quota and restart).

The mirror is not trusted: its listing is read up to ``MAX_LISTING_BYTES``, at most ``MAX_FILES`` files, and every
name must be a plain relative path (no ``..``, ``.``, empty part, absolute path, backslash, NUL or control
character) or the whole repository is refused; sizes it states only refuse early a repository that cannot fit."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import quote

from caldera import outbound
from caldera.errors import Invalid
from caldera.storage import fetch
from caldera.storage.errors import PathRefused
from caldera.storage.paths import MAX_PATH_CHARS, file_parts

SCHEME = "hf://"
MAX_SOURCE_CHARS = 300
MAX_FILES = 1000
MAX_LISTING_BYTES = 4 << 20
# the Hub's own rule for a namespace or a repository's name: letters, digits, "-", "_", ".", neither first nor last
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
# a branch, tag or commit, or a ref such as refs/pr/1: parts of letters, digits and ._- (no "..")
_REVISION = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}(?:/[A-Za-z0-9][A-Za-z0-9._-]{0,99}){0,3}"
SOURCE = re.compile(
    rf"hf://(?P<datasets>datasets/)?(?P<owner>{_NAME})/(?P<name>{_NAME})(?:@(?P<revision>{_REVISION}))?"
)
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Repo:
    kind: str  # model | dataset
    owner: str
    name: str
    revision: str

    def __str__(self) -> str:
        return f"{SCHEME}{self._prefix}{self.owner}/{self.name}@{self.revision}"

    @property
    def _prefix(self) -> str:
        return "datasets/" if self.kind == "dataset" else ""

    def listing_url(self, mirror: str) -> str:
        """The Hub's repository info at a revision; ``blobs`` asks for each file's size."""
        return f"{mirror}/api/{self.kind}s/{self.owner}/{self.name}/revision/{quote(self.revision, safe='')}?blobs=true"

    def file_url(self, mirror: str, rfilename: str, revision: str) -> str:
        rev, name = quote(revision, safe=""), quote(rfilename, safe="/")
        return f"{mirror}/{self._prefix}{self.owner}/{self.name}/resolve/{rev}/{name}"


def is_repo(source: str) -> bool:
    return source.startswith(SCHEME)


def parse(source: str) -> Repo:
    """The repository ``source`` names (the revision ``main`` unless given), refused (400, with a code) otherwise."""
    m = SOURCE.fullmatch(source) if len(source) <= MAX_SOURCE_CHARS else None
    if m is None or ".." in source:
        raise Invalid(
            "url",
            "not a repository: hf://OWNER/REPO[@REVISION] for a model, hf://datasets/OWNER/REPO[@REVISION] for a "
            "dataset (letters, digits and ._-)",
            "HubBadSource",
        )
    kind = "dataset" if m["datasets"] else "model"
    return Repo(kind, m["owner"], m["name"], m["revision"] or "main")


NO_MIRROR = "no Hugging Face mirror is configured: an admin sets huggingface_mirror_url"


def no_mirror() -> Invalid:
    return Invalid("url", NO_MIRROR, "HubNoMirror")


@dataclass(frozen=True)
class Listing:
    commit: str | None  # the revision's commit, when the mirror said it: every file is asked at that commit
    files: list[tuple[str, int | None]]  # each file's name in the repository and the size the mirror stated


def read_listing(url: str, allowed: outbound.Networks) -> bytes:
    """The listing's body, at most MAX_LISTING_BYTES (FetchFailed otherwise, or when the mirror refuses)."""
    with fetch.open_stream(url, allowed, 0) as (response, _):
        body = response.read(MAX_LISTING_BYTES + 1)
    if len(body) > MAX_LISTING_BYTES:
        raise fetch.FetchFailed(f"the mirror's listing is larger than {MAX_LISTING_BYTES} bytes")
    return body


def listing(body: bytes) -> Listing:
    """The files of a repository as its listing (the Hub's JSON) names them, each name checked."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise fetch.FetchFailed("the mirror's listing is not JSON") from None
    siblings = data.get("siblings") if isinstance(data, dict) else None
    if not isinstance(siblings, list):
        raise fetch.FetchFailed("the mirror's listing has no list of files (siblings)")
    if not siblings:
        raise fetch.FetchFailed("the repository has no files")
    if len(siblings) > MAX_FILES:
        raise fetch.FetchFailed(f"the repository has more than {MAX_FILES} files")
    files = []
    for sibling in siblings:
        name = sibling.get("rfilename") if isinstance(sibling, dict) else None
        check_name(name)
        size = sibling.get("size")
        files.append((name, size if type(size) is int and size >= 0 else None))  # bool is no size
    _check_unique([name for name, _ in files])
    commit = data.get("sha")
    return Listing(commit if isinstance(commit, str) and _COMMIT.fullmatch(commit) else None, files)


def check_name(name: object) -> None:
    """A file's name as the mirror gave it: a plain relative path, each part a name (FetchFailed otherwise)."""
    if not isinstance(name, str) or not name:
        raise fetch.FetchFailed("the mirror listed a file without a name")
    shown = json.dumps(name[:200])  # quoted, control characters escaped
    if len(name) > MAX_PATH_CHARS or "\\" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise fetch.FetchFailed(f"the mirror listed a file name that is refused: {shown}")
    if any(part in ("", ".", "..") for part in name.split("/")):  # also a leading "/" (absolute), "a//b", "a/"
        raise fetch.FetchFailed(f"the mirror listed a file name that is refused: {shown}")
    try:
        file_parts(name)  # the space's own rules: UTF-8, each name at most 255 bytes
    except PathRefused:
        raise fetch.FetchFailed(f"the mirror listed a file name that is refused: {shown}") from None


def _check_unique(names: list[str]) -> None:
    """No name twice, and none both a file and another's folder."""
    folders = {"/".join(parts[:i]) for parts in (n.split("/") for n in names) for i in range(1, len(parts))}
    seen: set[str] = set()
    for name in names:
        if name in seen or name in folders:
            raise fetch.FetchFailed(f"the mirror listed {json.dumps(name[:200])} twice, or as a file and a folder")
        seen.add(name)
