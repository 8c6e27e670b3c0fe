"""The Python SDK: ``Client(url, token)`` with one method per API call. The CLI is written on it, so one HTTP layer
serves both and one suite tests both.

Errors are typed: ``NotFound``, ``Forbidden``, ``Unauthorized``, ``Conflict``, ``Invalid`` (with ``.errors``, the
API's field errors as ``[{"field": ..., "reason": ...}]``), all subclasses of ``ApiError``.

There is no async client: every call is one short request except ``logs(follow=True)``, an iterator that a thread
or ``asyncio.to_thread`` runs well; a second class would double the surface for no researcher's workflow we know.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import httpcore
import httpx

from caldera.storage.direct_writer import DirectWriter

ENDED = ("Succeeded", "Failed", "Cancelled", "Lost")


class ApiError(Exception):
    """An answer of the API with a status of 400 or more; ``errors`` lists the fields it refused and why."""

    def __init__(self, status: int, detail: str, errors: list[dict] | None = None):
        super().__init__(f"{status}: {detail}")
        self.status, self.detail, self.errors = status, detail, errors or []


class Invalid(ApiError):
    """400/422: the request (a spec, a form) is refused; ``errors`` says which fields."""


class Unauthorized(ApiError):
    """401: not logged in, or the token expired or was revoked."""


class Forbidden(ApiError):
    """403: logged in, but not allowed (another user's job, an admin route)."""


class NotFound(ApiError):
    """404: no such job, image, template, user; or an id prefix that matches none."""


class Conflict(ApiError):
    """409: the object exists or is in a state that forbids it; also an ambiguous id prefix."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: Invalid,
    422: Invalid,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
}


def error_for(status: int, detail: str, errors: list[dict] | None = None) -> ApiError:
    return _BY_STATUS.get(status, ApiError)(status, detail, errors)


def config_path() -> Path:
    base = os.environ.get("CALDERA_CONFIG_DIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "caldera"
    )
    return Path(base) / "credentials.json"


def load_credentials() -> dict[str, str]:
    """The CLI's credentials file, overridden by CALDERA_URL and CALDERA_TOKEN."""
    creds: dict[str, str] = {}
    path = config_path()
    if path.exists():
        creds = json.loads(path.read_text())
    if os.environ.get("CALDERA_URL"):
        creds["url"] = os.environ["CALDERA_URL"]
    if os.environ.get("CALDERA_TOKEN"):
        creds["token"] = os.environ["CALDERA_TOKEN"]
    return creds


def save_credentials(url: str, token: str, username: str) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # a token is a password
    with os.fdopen(fd, "w") as fh:
        json.dump({"url": url, "token": token, "username": username}, fh)
    os.replace(tmp, path)
    return path


def forget_credentials() -> Path | None:
    path = config_path()
    if not path.exists():
        return None
    path.unlink()
    return path


def _params(**params: Any) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


class Client:
    """``Client()`` uses the CLI's credentials (``caldera login``, or CALDERA_URL/CALDERA_TOKEN); ``Client(url,
    token)`` a token of ``caldera tokens create``. Jobs, images and templates are the API's own JSON objects."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        if url is None or token is None:
            creds = load_credentials()
            url = url or creds.get("url")
            token = token or creds.get("token")
            if not url:
                raise Unauthorized(401, "not logged in: run `caldera login` first")
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    @classmethod
    def from_config(cls) -> Client:
        creds = load_credentials()
        if not creds.get("url") or not creds.get("token"):
            raise Unauthorized(401, "not logged in: run `caldera login` first")
        return cls(creds["url"], creds["token"])

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the one HTTP layer ------------------------------------------------------------------------------------
    @staticmethod
    def _check(resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            try:
                body = resp.json()
                detail, errors = str(body.get("detail", resp.text)), body.get("errors")
            except (ValueError, AttributeError):
                detail, errors = resp.text, None
            raise error_for(resp.status_code, detail, errors)
        return resp.json() if resp.content else None

    def get(self, path: str, /, **params: Any) -> Any:
        return self._check(self.http.get(f"/api/v1{path}", params=_params(**params)))

    def post(self, path: str, body: Any = None) -> Any:
        return self._check(self.http.post(f"/api/v1{path}", json=body))

    def put(self, path: str, body: Any) -> Any:
        return self._check(self.http.put(f"/api/v1{path}", json=body))

    def delete(self, path: str, /, **params: Any) -> Any:
        return self._check(self.http.delete(f"/api/v1{path}", params=_params(**params)))

    def patch(self, path: str, body: Any) -> Any:
        return self._check(self.http.patch(f"/api/v1{path}", json=body))

    def stream(self, path: str, **params: Any) -> Iterator[bytes]:
        with self.http.stream("GET", f"/api/v1{path}", params=_params(**params), timeout=None) as resp:
            if resp.status_code >= 400:
                resp.read()
                self._check(resp)
            yield from resp.iter_raw()

    # ---- jobs and job arrays -------------------------------------------------------------------------------------
    def submit(self, spec: Any = None, *, yaml_text: str | None = None, array: str | None = None, **overrides: Any):
        """Submit a job from a ``JobSpec``, a dict, or YAML text; keyword arguments override the spec's fields.
        With ``array`` (Slurm's ``--array``: ``0-99%8``, ``1,3,5``, ``0-20:5``) the spec is submitted as a job array
        of one task per index, and the answer is the array (as ``array()`` gives it), not a job."""
        if yaml_text is not None:
            import yaml

            spec = yaml.safe_load(yaml_text)
        if hasattr(spec, "model_dump"):
            spec = spec.model_dump(mode="json", exclude_none=True)
        if not isinstance(spec, dict):
            raise TypeError("a job spec is a JobSpec, a mapping, or YAML text of one")
        spec = {**spec, **_params(**overrides)}
        if array is not None:
            return self.post("/arrays", {"spec": spec, "array": array})
        return self.post("/jobs", spec)

    def jobs(self, *, all: bool = False, state: list[str] | None = None, limit: int | None = None) -> list[dict]:
        """Jobs, newest first; a job array's tasks are jobs with ``array_id`` and ``array_index``."""
        return self.get("/jobs", all=all or None, state=state or None, limit=limit)

    def arrays(self, *, all: bool = False, limit: int | None = None) -> list[dict]:
        """Job arrays, newest first, each with its tasks counted per state (``array`` gives one with its tasks)."""
        return self.get("/arrays", all=all or None, limit=limit)

    def array(self, array_id: str) -> dict:
        """A job array; ``array_id`` may be a unique prefix."""
        kind, whole = self.resolve(array_id)
        if kind != "arrays":
            raise NotFound(404, f"{array_id!r} is a job, not a job array")
        return self.get(f"/arrays/{whole}")

    def resolve(self, ref: str) -> tuple[str, str]:
        """``("jobs", id)`` or ``("arrays", id)`` for a job id, a job array id, a unique prefix of either (as git
        resolves commits), or ``ARRAY_INDEX`` for one task of an array, as Slurm writes it."""
        task = re.fullmatch(r"([A-Za-z0-9]+)_(\d{1,7})", ref)
        if task:
            array = self.array(task.group(1))
            found = [t["id"] for t in array["tasks"] if t["index"] == int(task.group(2))]
            if not found:
                raise NotFound(404, f"job array {array['id']} has no task {task.group(2)}")
            return "jobs", found[0]
        for kind in ("jobs", "arrays"):
            try:
                return kind, self.get(f"/{kind}/{ref}")["id"]
            except NotFound:
                pass
        try:
            listed = self.jobs(all=True, limit=5000)
        except Forbidden:
            listed = self.jobs(limit=5000)
        ids = {("jobs", j["id"]) for j in listed} | {("arrays", j["array_id"]) for j in listed if j.get("array_id")}
        matches = sorted(x for x in ids if x[1].startswith(ref))
        if not matches:
            raise NotFound(404, f"no job {ref!r}")
        if len(matches) > 1:
            names = ", ".join(m[1] for m in matches[:10])
            raise Conflict(409, f"{ref!r} is the start of {len(matches)} jobs: {names}")
        return matches[0]

    def resolve_job(self, job_id: str) -> str:
        """A whole job id from a unique prefix, or from ``ARRAY_INDEX``; a job array's id is refused."""
        kind, whole = self.resolve(job_id)
        if kind == "arrays":
            raise Invalid(400, f"{whole} is a job array: name one of its tasks, as {whole}_INDEX")
        return whole

    def job(self, job_id: str) -> dict:
        """A job with its events; ``job_id`` may be a unique prefix."""
        return self.get(f"/jobs/{self.resolve_job(job_id)}")

    def why(self, job_id: str) -> dict:
        return self.get(f"/jobs/{self.resolve_job(job_id)}/why")

    def cancel(self, job_id: str) -> dict:
        """A job, or every task of a job array that has not ended; the job or the array as it is now."""
        kind, whole = self.resolve(job_id)
        return self.post(f"/{kind}/{whole}/cancel")

    def hold(self, job_id: str, reason: str = "") -> dict:
        """Keep a waiting job (or a job array's waiting tasks) from starting until ``release``; an admin's hold
        only an admin releases."""
        kind, whole = self.resolve(job_id)
        return self.post(f"/{kind}/{whole}/hold", {"reason": reason})

    def release(self, job_id: str) -> dict:
        kind, whole = self.resolve(job_id)
        return self.post(f"/{kind}/{whole}/release")

    def requeue(self, job_id: str, reason: str = "") -> dict:
        """Admins: stop a running job as a preemption does and put it back in its queue."""
        return self.post(f"/jobs/{self.resolve_job(job_id)}/requeue", {"reason": reason})

    def wait(self, job_id: str, timeout: float | None = None, poll_s: float = 1.0) -> dict:
        """The job (or job array: once every task ended) when it ended; ``TimeoutError`` after ``timeout`` s."""
        (kind, whole), t0 = self.resolve(job_id), time.monotonic()
        while True:
            j = self.get(f"/{kind}/{whole}")
            if j["state"] in ENDED:
                return j
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{whole} still {j['state']} after {timeout:g}s")
            time.sleep(poll_s)

    def logs(self, job_id: str, *, follow: bool = False, rank: int | None = None) -> Iterator[bytes]:
        """The job's output as it comes; with ``follow`` until the job ends."""
        job_id = self.resolve_job(job_id)
        yield from self.stream(f"/jobs/{job_id}/logs", follow=str(follow).lower(), rank=rank)

    # ---- images, templates, usage, nodes ------------------------------------------------------------------------
    def images(self) -> list[dict]:
        return self.get("/images")

    def image(self, image_id: str) -> dict:
        return self.get(f"/images/{image_id}")

    def snapshot(self, job_id: str, name: str, **form: Any) -> dict:
        """Save a running job's container as an image."""
        return self.post("/images/snapshots", {"job_id": self.resolve_job(job_id), "name": name, **form})

    def templates(self) -> list[dict]:
        return self.get("/templates")

    def template(self, template_id: int) -> dict:
        return self.get(f"/templates/{template_id}")

    def usage(self) -> dict:
        return self.get("/usage")

    def accounting(self, since: str = "30d", limit: int | None = None) -> dict:
        """The jobs that ended since ``since`` (30d, 12h, 2w or a UTC date), with their GPU-hours, as Slurm's sacct:
        yours (an admin: everyone's)."""
        return self.get("/accounting", since=since, limit=limit)

    def nodes(self) -> list[dict]:
        return self.get("/nodes")

    # ---- metrics (read from Prometheus by the platform; ``available`` False with a ``reason`` when it cannot) ----
    def gpu_hours(self, since: str = "7d", by: str = "user") -> dict:
        """GPU-hours allocated and used per UTC day and per user, account or queue: yours (an admin: everyone's)."""
        return self.get("/usage/gpu-hours", since=since, by=by)

    def idle_gpu_hours(self, since: str = "7d", by: str = "user") -> dict:
        """The low-utilisation list: GPU-hours allocated but idle per user or account, the most idle first (admins:
        everyone; account admins: their accounts)."""
        return self.get("/usage/idle-gpu-hours", since=since, by=by)

    def gpu_hours_csv(self, since: str = "30d", by: str = "user") -> str:
        """Everyone's GPU-hours as CSV (admins)."""
        resp = self.http.get("/api/v1/usage/gpu-hours.csv", params={"since": since, "by": by})
        if resp.status_code >= 400:
            self._check(resp)
        return resp.text

    def cluster_metrics(self, since: str = "1d") -> dict:
        return self.get("/metrics/cluster", since=since)

    def node_metrics(self, node: str, since: str = "1d") -> dict:
        return self.get(f"/metrics/nodes/{node}", since=since)

    def job_metrics(self, job_id: str) -> dict:
        return self.get(f"/metrics/jobs/{self.resolve_job(job_id)}")

    def allocated_gpus(self, window_s: int = 600) -> dict:
        """The GPUs held now (yours; an admin: all) with their mean utilisation over ``window_s``."""
        return self.get("/metrics/allocated", window_s=window_s)

    def me(self) -> dict:
        return self.get("/me")

    # ---- files (docs/storage.md): ``space`` is personal, personal:<user>, account:<name> or public --------------
    def spaces(self) -> list[dict]:
        return self.get("/spaces")

    def space(self, space: str = "personal") -> dict:
        return self.get(f"/spaces/{space}")

    def ls(self, path: str = "", space: str = "personal", page: int = 1000) -> Iterator[dict]:
        """Every entry of a folder, fetched a page at a time."""
        after: str | None = ""
        while after is not None:
            got = self.get(f"/spaces/{space}/list", path=path, after=after, limit=page)
            yield from got["entries"]
            after = got["next"]

    def mkdir(self, path: str, space: str = "personal", parents: bool = False) -> dict:
        return self.post(f"/spaces/{space}/folders", {"path": path, "parents": parents})

    def move(self, src: str, dst: str, space: str = "personal") -> dict:
        return self.post(f"/spaces/{space}/move", {"src": src, "dst": dst})

    def remove(self, path: str, space: str = "personal") -> dict:
        return self.delete(f"/spaces/{space}/files", path=path)

    def upload(
        self,
        local: str | Path,
        path: str,
        space: str = "personal",
        chunk_bytes: int = 8 * 2**20,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict:
        """Upload a file in chunks. An upload interrupted before (the same file, unchanged, to the same place)
        resumes where the platform's copy ends; ``progress(done, total)`` after each chunk."""
        local = Path(local)
        st = local.stat()
        key = f"{self.url} {space} {path} {st.st_size} {st.st_mtime_ns}"
        pending = _pending_uploads()
        upload = None
        if key in pending:
            try:
                upload = self.get(f"/spaces/{space}/uploads/{pending[key]}")
            except NotFound:
                upload = None
        if upload is None:
            upload = self.post(f"/spaces/{space}/uploads", {"path": path, "size": st.st_size})
            if upload.get("done"):
                return upload
            _remember_upload(key, upload["id"])
        offset, url = upload["offset"], f"/api/v1/spaces/{space}/uploads/{upload['id']}"
        with local.open("rb", buffering=0) as fh:
            while offset < st.st_size:
                size = min(chunk_bytes, st.st_size - offset)
                headers = {"Upload-Offset": str(offset), "Content-Length": str(size)}
                resp = self.http.patch(url, content=_pieces(fh, offset, size), headers=headers, timeout=None)
                upload = self._check(resp)
                offset = upload["offset"]
                if progress:
                    progress(offset, st.st_size)
        _remember_upload(key, None)
        return upload

    def download(
        self,
        path: str,
        local: str | Path,
        space: str = "personal",
        progress: Callable[[int, int], None] | None = None,
    ) -> Path:
        """Download to ``local`` (through a temporary file beside it: a broken transfer leaves no partial file)."""
        local = Path(local)
        tmp = local.with_name(f".{local.name}.part")
        url = f"/api/v1/spaces/{space}/files"
        with self.http.stream("GET", url, params={"path": path}, timeout=None) as resp:
            if resp.status_code >= 400:
                resp.read()
                self._check(resp)
            total, done = int(resp.headers.get("content-length", 0)), 0
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
                try:
                    with DirectWriter(fd) as fh:  # past the page cache, as the server writes uploads
                        for block in _body_blocks(resp):
                            fh.write(block)
                            done += len(block)
                            if progress:
                                progress(done, total)
                finally:
                    os.close(fd)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        os.replace(tmp, local)
        return local

    # ---- the datasets and models catalogue ------------------------------------------------------------------------
    def publish(
        self,
        name: str,
        version: str,
        *,
        kind: str = "dataset",
        wait: bool = True,
        timeout: float | None = None,
        progress: Callable[[dict], None] | None = None,
        **fields: Any,
    ) -> dict:
        """Publish a folder (``space``, ``path``; or ``from_job``) as a version; the server copies it in its
        background: with ``wait``, the version once ready (``Conflict`` with why if its copy failed), else at once,
        copying."""
        entry = self.post("/catalogue", {"kind": kind, "name": name, "version": version, **fields})
        return self.wait_published(kind, entry["ref"], timeout, progress=progress) if wait else entry

    def wait_published(
        self,
        kind: str,
        ref: str,
        timeout: float | None = None,
        poll_s: float = 0.5,
        progress: Callable[[dict], None] | None = None,
    ) -> dict:
        """The version ``name@version`` once its copy ended: ready, or ``Conflict`` with why it failed;
        ``progress`` hears of it (its ``size_bytes`` and ``files`` so far) while it is copied; ``TimeoutError``
        after ``timeout`` s."""
        t0 = time.monotonic()
        while (entry := self.get(f"/catalogue/{kind}/{ref}"))["state"] == "copying":
            if progress:
                progress(entry)
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{kind} {ref} still copying after {timeout:g}s")
            time.sleep(poll_s)
        if entry["state"] == "failed":
            why = entry.get("error") or {}
            raise Conflict(409, f"{kind} {ref} was not published: {why.get('reason', '')}", [why])
        return entry


# A chunk goes out, and a download comes in, a mebibyte at a time: httpcore copies the rest of a buffer after each
# partial send (a 64 MiB chunk as one bytes object was copied over and over: the upload ran at a tenth of its speed),
# and h11 hands a body over 64 KiB at a time with three copies of each piece.
_PIECE = 1 << 20


def _pieces(fh: BinaryIO, offset: int, size: int) -> Iterator[bytes]:
    """``size`` bytes of the file from ``offset``, a piece at a time (each read when httpx is ready to send it)."""
    fh.seek(offset)
    while size > 0:
        piece = fh.read(min(_PIECE, size))
        if not piece:
            raise OSError(f"{fh.name} became shorter while it was uploaded")
        size -= len(piece)
        yield piece


def _body_blocks(resp: httpx.Response) -> Iterator[bytes]:
    """The body of a streamed response. A plain body of a stated length is read from the connection itself
    (httpcore's ``network_stream`` extension), a mebibyte at a time, after the bytes h11 holds already; any other
    (compressed, chunked, HTTP/2: framed) goes through httpx. The connection is then closed, never reused: h11 did
    not see the end of the body."""
    stream = resp.extensions.get("network_stream")
    left = int(resp.headers.get("content-length", -1))
    plain = resp.http_version == "HTTP/1.1" and not {"content-encoding", "transfer-encoding"} & resp.headers.keys()
    if stream is None or left < 0 or not plain:
        yield from resp.iter_bytes()
        return
    raw = resp.iter_raw()
    for held in raw:  # what came in with the headers: only h11 has it
        left -= len(held)
        yield held
        break
    timeout = resp.request.extensions.get("timeout", {}).get("read")
    while left > 0:
        try:
            block = stream.read(min(_PIECE, left), timeout=timeout)
        except httpcore.TimeoutException as exc:  # as httpx says it when it reads
            raise httpx.ReadTimeout(str(exc), request=resp.request) from exc
        except httpcore.NetworkError as exc:
            raise httpx.ReadError(str(exc), request=resp.request) from exc
        if not block:
            raise httpx.RemoteProtocolError("the server closed the connection before the end of the file")
        left -= len(block)
        yield block
    raw.close()


def _uploads_path() -> Path:
    return config_path().with_name("uploads.json")


def _pending_uploads() -> dict[str, str]:
    try:
        return json.loads(_uploads_path().read_text())
    except (OSError, ValueError):
        return {}


def _remember_upload(key: str, upload_id: str | None) -> None:
    """Which upload carries which local file, so that an interrupted one resumes next time."""
    pending = _pending_uploads()
    if upload_id is None:
        pending.pop(key, None)
    else:
        pending[key] = upload_id
    path = _uploads_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(json.dumps(pending))
