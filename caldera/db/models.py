"""Tables. Times are UTC epoch seconds (floats): portable across SQLite and PostgreSQL and cheap to compare."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16), default="user")
    default_account: Mapped[str | None] = mapped_column(String(64), nullable=True)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[float] = mapped_column(Float)
    # the unprivileged OS uid (= gid) this user's jobs run as, fixed on first use so files keep their owner
    os_uid: Mapped[int | None] = mapped_column(Integer, nullable=True, unique=True)
    # tokens and sessions issued before this moment (a password change) are no longer accepted
    credentials_changed_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Account(Base):
    __tablename__ = "accounts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)


class Membership(Base):
    __tablename__ = "account_members"
    __table_args__ = (UniqueConstraint("account_id", "user_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    # an account admin decides its members' extend and lock requests (caldera.governance.requests)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)


class Queue(Base):
    __tablename__ = "queues"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # QueueConfig without name/account
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)


class ApiToken(Base):
    """Personal API tokens (CLI) and browser sessions. Only a SHA-256 of the secret is kept."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # "personal" | "session"
    name: Mapped[str] = mapped_column(String(128), default="")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # shown in listings so users can tell tokens apart
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class RefreshToken(Base):
    """Issued refresh tokens by id, so a refresh token is used once (rotation) and can be revoked."""

    __tablename__ = "refresh_tokens"
    jti: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    expires_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_state", "state"), Index("ix_jobs_user_state", "user_id", "state"))
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    account: Mapped[str] = mapped_column(String(64))
    queue: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    priority: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    workdir: Mapped[str] = mapped_column(Text, default="")
    submitted_at: Mapped[float] = mapped_column(Float)
    queued_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    allocations: Mapped[list[Any]] = mapped_column(JSON, default=list)
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # the runtime that launched the current attempt (None: launched before this was recorded; see runtime_names)
    runtime: Mapped[str | None] = mapped_column(String(64), nullable=True)
    pending_reasons: Mapped[list[Any]] = mapped_column(JSON, default=list)
    attained_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)
    stop_requested: Mapped[str | None] = mapped_column(String(16), nullable=True)  # "cancel" | "preempt"
    stop_detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # a queued job held back from the scheduler: {"by", "admin", "at", "note"} (caldera/server/holds.py)
    hold: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # a task of a job array (caldera/server/arrays.py): its array and its index there (CALDERA_ARRAY_INDEX)
    array_id: Mapped[str | None] = mapped_column(
        ForeignKey("job_arrays.id", ondelete="CASCADE"), nullable=True, index=True
    )
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the spec's publish once the job has succeeded (caldera/server/job_publish.py): pending, published or failed,
    # and its outcome: {"ref", "left_out"} or {"model", "error"}
    publish_state: Mapped[str | None] = mapped_column(String(16), nullable=True, index=True)
    publish_result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # set by every write of the row, by triggers (migration 0022): on SQLite a counter's value, on PostgreSQL the
    # writing transaction's id. The live loop reads only the rows changed since its last cycle
    # (caldera/server/snapshot_jobs.py). Never written by the application.
    change_seq: Mapped[int] = mapped_column(BigInteger, server_default="0", index=True)


class JobChangeCounter(Base):
    """The one row whose value ``jobs.change_seq`` takes on SQLite, bumped by the triggers of migration 0022."""

    __tablename__ = "job_change_counter"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class JobDeletion(Base):
    """A job row deleted (by the triggers of migration 0022), with its ``change_seq`` as a write would have set it."""

    __tablename__ = "job_deletions"
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    job_id: Mapped[str] = mapped_column(String(32), primary_key=True)  # on PostgreSQL one seq per transaction


class JobArray(Base):
    """One submission of many tasks (``caldera submit --array 0-99%8``); each task is a job of its own."""

    __tablename__ = "job_arrays"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(128))
    expression: Mapped[str] = mapped_column(String(256))  # as submitted, e.g. 0-99%8
    size: Mapped[int] = mapped_column(Integer)
    max_running: Mapped[int | None] = mapped_column(Integer, nullable=True)  # %N
    submitted_at: Mapped[float] = mapped_column(Float)


class JobEventRow(Base):
    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job", "job_id", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    at: Mapped[float] = mapped_column(Float)
    from_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    # the values the message was made from, so a page renders it in its reader's language; None: only the message
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class Usage(Base):
    """Decayed GPU-seconds per user ("user:<name>") and per queue ("queue:<name>"), for fair share."""

    __tablename__ = "usage"
    key: Mapped[str] = mapped_column(String(160), primary_key=True)
    value: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[float] = mapped_column(Float)


class JobTemplate(Base):
    """A saved job body (the API's format, checked by the spec's rules when saved), its owner's, readable by the
    members of the account it is shared with."""

    __tablename__ = "job_templates"
    __table_args__ = (UniqueConstraint("owner_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    description: Mapped[str] = mapped_column(Text, default="")
    kind: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    shared_account: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class AdminAudit(Base):
    """What an admin did, newest last: who, which action, on what, and the non-secret part of the request."""

    __tablename__ = "admin_audit"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(256))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)


class Image(Base):
    """An image users made (a build from a form or a snapshot): its reference is
    <registry>/<namespace>/<name>:<tag>, the namespace user/<owner>, account/<account> or public."""

    __tablename__ = "images"
    __table_args__ = (Index("ix_images_ref", "namespace", "name", "tag"), Index("ix_images_owner", "owner_id"))
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    namespace: Mapped[str] = mapped_column(String(80))
    name: Mapped[str] = mapped_column(String(64))
    tag: Mapped[str] = mapped_column(String(64))
    visibility: Mapped[str] = mapped_column(String(16))  # private | account | public
    source: Mapped[str] = mapped_column(String(16))  # form | snapshot
    form: Mapped[dict[str, Any]] = mapped_column(JSON)  # the build form, or the snapshot's session
    state: Mapped[str] = mapped_column(String(16))  # building | ready | failed
    message: Mapped[str] = mapped_column(Text, default="")
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ImageQuota(Base):
    """A user's image quota when an admin set one; the settings' default otherwise."""

    __tablename__ = "image_quotas"
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    quota_bytes: Mapped[int] = mapped_column(BigInteger)


class NodeCordon(Base):
    """A node an admin took out of scheduling (cordoned, or drained: cordoned and its jobs preempted); no row, in
    service. Kept in the database so a restart keeps the node out."""

    __tablename__ = "node_cordons"
    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    by: Mapped[str] = mapped_column(String(64))
    at: Mapped[float] = mapped_column(Float)
    drained: Mapped[bool] = mapped_column(Boolean, default=False)


class SshKey(Base):
    """A user's SSH public key (the OpenSSH line, as checked by core.ssh_keys), for reaching their own jobs."""

    __tablename__ = "ssh_keys"
    __table_args__ = (UniqueConstraint("user_id", "fingerprint"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    key_type: Mapped[str] = mapped_column(String(32))
    public_key: Mapped[str] = mapped_column(Text)  # the canonical line: type, base64, comment
    fingerprint: Mapped[str] = mapped_column(String(64))  # SHA256:<base64 without padding>, 50 characters
    created_at: Mapped[float] = mapped_column(Float)


class Environment(Base):
    """An entry of the admins' catalogue of the platform's own images (a base image the build form builds on, or a
    ready environment jobs run in): what the forms offer, with what is inside."""

    __tablename__ = "environments"
    ref: Mapped[str] = mapped_column(String(128), primary_key=True)  # caldera/<name>:<tag>, on every node
    kind: Mapped[str] = mapped_column(String(16))  # base | ready
    python: Mapped[str] = mapped_column(String(16))
    cuda: Mapped[str] = mapped_column(String(16))  # a version, or "none"
    inside: Mapped[str] = mapped_column(Text, default="")
    added_by: Mapped[str] = mapped_column(String(64))
    added_at: Mapped[float] = mapped_column(Float)


class NotificationSettings(Base):
    """Where and in which language a user is told about their jobs; ``channels`` maps an event kind to the
    channels chosen for it (an event missing from it gets ``caldera.notify.events.DEFAULT_CHANNELS``)."""

    __tablename__ = "notification_settings"
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    email: Mapped[str] = mapped_column(String(254), default="")
    webhook_url: Mapped[str] = mapped_column(String(2048), default="")
    language: Mapped[str] = mapped_column(String(8), default="en")
    channels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Notification(Base):
    """One thing a user was told, rendered in their language: the portal's list (unread until ``read_at``)."""

    __tablename__ = "notifications"
    __table_args__ = (Index("ix_notifications_user", "user_id", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    subject: Mapped[str] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    in_portal: Mapped[bool] = mapped_column(Boolean, default=True)
    read_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class OutboxMessage(Base):
    """A notification waiting for (or past) delivery on an outside channel (e-mail, webhook): the loop never
    waits on a mail server; the dispatcher retries with backoff until ``sent`` or ``failed``."""

    __tablename__ = "notification_outbox"
    __table_args__ = (Index("ix_outbox_due", "state", "next_try_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    notification_id: Mapped[int] = mapped_column(ForeignKey("notifications.id", ondelete="CASCADE"))
    channel: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(2048))
    state: Mapped[str] = mapped_column(String(16), default="pending")  # pending | sent | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_try_at: Mapped[float] = mapped_column(Float)
    last_error: Mapped[str] = mapped_column(Text, default="")
    sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class StorageSpace(Base):
    """A storage space (caldera.storage): ``kind`` personal, account or public and ``name`` its user or account
    ("" for public). Quotas are the settings' defaults where null; the usage counters move with every write
    through the platform and are set right by an occasional walk (``reconciled_at``)."""

    __tablename__ = "storage_spaces"
    __table_args__ = (UniqueConstraint("kind", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(64))
    quota_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    quota_files: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    used_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    used_files: Mapped[int] = mapped_column(BigInteger, default=0)
    reconciled_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class StorageMemberMode(Base):
    """A member's access to their account's space where an admin changed it from the default, read-write."""

    __tablename__ = "storage_member_modes"
    space_id: Mapped[int] = mapped_column(ForeignKey("storage_spaces.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    mode: Mapped[str] = mapped_column(String(8))  # ro | rw


class StorageUpload(Base):
    """A resumable upload under way: its bytes are a part file in the space's upload folder, named by ``id``."""

    __tablename__ = "storage_uploads"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    space_id: Mapped[int] = mapped_column(ForeignKey("storage_spaces.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    path: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)


class JobGovernance(Base):
    """What governance recorded about a job (caldera.governance): its warnings, its lock and extensions, and the
    snapshot an idle stop waits for. No row: nothing yet."""

    __tablename__ = "job_governance"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    idle_warned_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    idle_flagged_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    limit_warned_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    locked_until: Mapped[float | None] = mapped_column(Float, nullable=True)
    extended_s: Mapped[float] = mapped_column(Float, default=0.0)
    # an idle Jupyter session being saved before its stop: the image id, and the stop's reason and values
    snapshot_image: Mapped[str | None] = mapped_column(String(32), nullable=True)
    pending_stop: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # right-sizing advice from a finished job's metrics: [{code, params}] ([] none); None: not yet looked at
    advice: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)


class GovernanceRequest(Base):
    """A user's request to extend or lock a job, and its decision."""

    __tablename__ = "governance_requests"
    __table_args__ = (Index("ix_governance_requests_state", "state"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # extend | lock
    seconds: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))  # pending | approved | declined | expired
    created_at: Mapped[float] = mapped_column(Float)
    decided_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    decided_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    note: Mapped[str] = mapped_column(Text, default="")


class CatalogueEntry(Base):
    """A dataset or model version (caldera/storage/catalogue.py): a copy of a space's folder in the platform's own
        store, named, described and visible to whom its owner said. A version never changes once published (ready);
    until then it is its publisher's to see, as it is copied."""

    __tablename__ = "catalogue_entries"
    __table_args__ = (UniqueConstraint("kind", "name", "version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # dataset | model
    name: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(32))
    description: Mapped[str] = mapped_column(Text, default="")
    tags: Mapped[list[Any]] = mapped_column(JSON, default=list)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    source: Mapped[str] = mapped_column(Text)  # the space and folder it was copied from
    visibility: Mapped[str] = mapped_column(String(16))  # private | shared | public
    shared_with: Mapped[list[Any]] = mapped_column(JSON, default=list)  # "user:<name>", "account:<name>"
    framework: Mapped[str] = mapped_column(String(64), default="")  # models: pytorch, jax...
    produced_by: Mapped[str] = mapped_column(String(32), default="")  # models: the job whose output it is
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    files: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    # its copy's folder in the store: random, never reused (a row's id may be, and meet a folder left behind)
    folder: Mapped[str] = mapped_column(String(32), unique=True)
    # copying (size_bytes and files: copied so far) | ready (mountable) | failed (``error``: message, code, params)
    state: Mapped[str] = mapped_column(String(16), default="ready", server_default="ready", index=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    left_out: Mapped[list[Any]] = mapped_column(JSON, default=list)  # what the copy left out, with why


class CatalogueName(Base):
    """Whose a catalogue name is: its first publisher's (one row per name, so two first publishes at once cannot
    both win); only they, the ``writers`` they granted it to, and admins add versions. Freed when its last version
    is deleted."""

    __tablename__ = "catalogue_names"
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    # "user:<name>", "account:<name>": who else may publish versions under the name (the owner grants it)
    writers: Mapped[list[Any]] = mapped_column(JSON, default=list)


class StorageImport(Base):
    """A download from a URL into a space (caldera/storage/fetch.py), its bytes in a part file of the space's
    upload folder until complete; ``restart`` continues it where the part ends."""

    __tablename__ = "storage_imports"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    space_id: Mapped[int] = mapped_column(ForeignKey("storage_spaces.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(Text)
    url: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))  # running | done | failed
    done_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    total_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
