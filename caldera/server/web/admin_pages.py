"""Admin pages: users (create, disable, role, password reset), queues and their quotas, nodes, everyone's jobs, the
audit log. Each one admins only, like the API."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.states import JobState
from caldera.core.tenancy import Role
from caldera.db.models import AdminAudit, Job, User
from caldera.server import api_admin, audit, jobs, node_admin, tenancy
from caldera.server.deps import db_session, platform
from caldera.server.errors import NotFound
from caldera.server.platform import Platform
from caldera.server.web import api_call, listing, queue_forms
from caldera.server.web.render import page
from caldera.server.web.session import PageNotFound, page_admin

router = APIRouter(prefix="/admin", include_in_schema=False)


USER_SORTS = {"username": User.username, "role": User.role, "active": User.active, "created_at": User.created_at}


def _users_page(request: Request, admin: User, db: Session, errors=(), typed=None, status=200):
    want = listing.parse(request, USER_SORTS, "username", ("name", "role"))
    query = select(User)
    if want.filters["name"]:
        query = query.where(User.username.contains(want.filters["name"], autoescape=True))
    if want.filters["role"]:
        query = query.where(User.role == want.filters["role"])
    found, want = listing.fetch(db, query, want, USER_SORTS, User.id)
    users = [api_admin._user_view(db, u) for u in found]
    accounts = api_admin.list_accounts(user=admin, db=db)
    return page(
        request, "admin_users.html", status=status, user=admin, users=users, accounts=accounts, listing=want,
        filters=want.filters, roles=[r.value for r in Role], errors=list(errors), typed=typed or {},
    )  # fmt: skip


@router.get("/users")
def users(request: Request, admin: User = Depends(page_admin), db: Session = Depends(db_session)):
    return _users_page(request, admin, db)


@router.post("/users")
def create_user(
    request: Request,
    username: str = Form("", max_length=64),
    password: str = Form("", max_length=1024),
    role: str = Form("user", max_length=16),
    account: str = Form("", max_length=64),
    admin: User = Depends(page_admin),
    db: Session = Depends(db_session),
):
    typed = {"username": username, "role": role, "account": account}
    accounts = [account] if account else []
    _, errors = api_call.call(
        db,
        lambda: api_admin.create_user(
            body=api_admin.UserIn(username=username, password=password, role=role, accounts=accounts), _=admin, db=db
        ),
    )
    if errors:
        return _users_page(request, admin, db, errors, typed, 400)
    return RedirectResponse("/admin/users", 303)


def _target(db: Session, username: str) -> User:
    try:
        return tenancy.get_user(db, username[:64])
    except NotFound:
        raise PageNotFound() from None


@router.post("/users/{username}/active")
def set_active(
    request: Request,
    username: str,
    active: str = Form(..., max_length=8),
    admin: User = Depends(page_admin),
    db: Session = Depends(db_session),
):
    target = _target(db, username)
    if target.id == admin.id:  # an admin cannot lock themselves out
        return _users_page(request, admin, db, [{"field": "", "reason": "you cannot disable yourself"}], status=400)
    target.active = active == "true"  # a disabled user's sessions and tokens stop working at once (deps.py)
    audit.record(db, admin, "enable-user" if target.active else "disable-user", target.username)
    db.commit()
    return RedirectResponse("/admin/users", 303)


@router.post("/users/{username}/role")
def set_role(
    request: Request,
    username: str,
    role: str = Form(..., max_length=16),
    admin: User = Depends(page_admin),
    db: Session = Depends(db_session),
):
    target = _target(db, username)
    if role not in {r.value for r in Role}:
        return _users_page(request, admin, db, [{"field": "role", "reason": f"unknown role {role!r}"}], status=400)
    if target.id == admin.id:
        return _users_page(request, admin, db, [{"field": "", "reason": "you cannot change your own role"}], 400)
    target.role = role
    audit.record(db, admin, "set-role", target.username, {"role": role})
    db.commit()
    return RedirectResponse("/admin/users", 303)


@router.post("/users/{username}/password")
def reset_password(
    request: Request,
    username: str,
    password: str = Form("", max_length=1024),
    admin: User = Depends(page_admin),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """The API's reset: the password rules, the target's logins end, the audit entry; one's own needs the
    current password, so it is refused here (the API's own rule)."""
    target = _target(db, username)
    _, errors = api_call.call(
        db,
        lambda: api_admin.reset_password(
            username=target.username, body=api_admin.PasswordIn(password=password), admin=admin, p=p, db=db
        ),
    )
    if errors:
        return _users_page(request, admin, db, errors, status=400)
    return RedirectResponse("/admin/users", 303)


@router.get("/queues")
def queues(request: Request, admin: User = Depends(page_admin), db: Session = Depends(db_session)):
    return page(
        request,
        "admin_queues.html",
        user=admin,
        queues=api_admin.list_queues(user=admin, db=db),
        accounts=api_admin.list_accounts(user=admin, db=db),
    )


def _queue_page(request: Request, admin: User, form: queue_forms.QueueForm, errors: list, status: int = 200):
    return page(request, "admin_queue.html", status=status, user=admin, form=form, errors=queue_forms.by_field(errors))


@router.get("/queue")
def edit_queue(
    request: Request, name: str = "", account: str = "", admin=Depends(page_admin), db: Session = Depends(db_session)
):
    try:
        q, owner = tenancy.get_queue(db, name[:64])
        form = queue_forms.form_of(tenancy.queue_config(q, owner).model_dump(mode="json"))
    except NotFound:
        form = queue_forms.form_of({"name": name[:64], "account": account[:64]})
    return _queue_page(request, admin, form, [])


@router.post("/queue")
def save_queue(
    request: Request,
    form: Annotated[queue_forms.QueueForm, Form()],
    admin: User = Depends(page_admin),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    body, errors = queue_forms.body_of(form)
    if not errors:
        _, errors = api_call.call(
            db, api_admin.put_queue, name=form.name, body=body, _=admin, p=p, db=db
        )  # the API's rules
        if not errors:
            return RedirectResponse("/admin/queues", 303)
    return _queue_page(request, admin, form, errors, 400)


@router.get("/nodes")
def nodes(request: Request, admin: User = Depends(page_admin), p=Depends(platform), db=Depends(db_session)):
    return page(request, "admin_nodes.html", user=admin, nodes=api_admin.nodes(user=admin, p=p, db=db))


@router.post("/nodes/{name}/cordon")
def cordon_node(
    request: Request,
    name: str,
    reason: str = Form("", max_length=1024),
    action: str = Form("cordon", max_length=16),
    admin: User = Depends(page_admin),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """The API's cordon, or its drain (cordon and preempt the node's jobs), with the same audit entry."""
    act = node_admin.drain_node if action == "drain" else node_admin.cordon_node
    _, errors = api_call.call(
        db, act, name=name[:128], body=node_admin.CordonIn(reason=reason), admin=admin, p=p, db=db
    )
    if errors:
        found = api_admin.nodes(user=admin, p=p, db=db)
        return page(request, "admin_nodes.html", status=404, user=admin, nodes=found, errors=errors)
    return RedirectResponse("/admin/nodes", 303)


@router.post("/nodes/{name}/uncordon")
def uncordon_node(name: str, admin: User = Depends(page_admin), p=Depends(platform), db=Depends(db_session)):
    try:
        node_admin.uncordon_node(name=name[:128], admin=admin, p=p, db=db)
    except NotFound:
        raise PageNotFound() from None
    return RedirectResponse("/admin/nodes", 303)


AUDIT_SORTS = {"at": AdminAudit.id, "actor": AdminAudit.actor, "action": AdminAudit.action, "target": AdminAudit.target}


@router.get("/audit")
def audit_log(request: Request, admin: User = Depends(page_admin), db: Session = Depends(db_session)):
    """Admin actions, newest first or as sorted, a page at a time, filtered by who, what and on what (in the URL)."""
    want = listing.parse(request, AUDIT_SORTS, "-at", ("actor", "action", "target"))
    rows, want = listing.fetch(db, audit.query(**want.filters), want, AUDIT_SORTS, AdminAudit.id)
    admins = db.scalars(select(User.username).where(User.role == Role.ADMIN.value).order_by(User.username))
    return page(
        request, "admin_audit.html", user=admin, entries=rows, listing=want, filters=want.filters,
        actions=audit.actions(db), admins=list(admins),
    )  # fmt: skip


JOB_SORTS = {
    "submitted_at": Job.submitted_at, "name": Job.name, "state": Job.state, "queue": Job.queue,
    "user": select(User.username).where(User.id == Job.user_id).scalar_subquery(),
}  # fmt: skip


@router.get("/jobs")
def all_jobs(request: Request, admin: User = Depends(page_admin), p=Depends(platform), db=Depends(db_session)):
    """Everyone's jobs, newest first or as sorted, a page at a time, narrowed by user, state and queue."""
    want = listing.parse(request, JOB_SORTS, "-submitted_at", ("user", "state", "queue"))
    owner, state, queue = (want.filters[k] for k in ("user", "state", "queue"))
    errors, owner_id = [], None
    if owner:
        try:
            owner_id = tenancy.get_user(db, owner).id
        except NotFound as exc:
            errors.append({"field": "user", "reason": exc.message})
    states = [s.value for s in JobState]
    if state and state not in states:
        errors.append({"field": "state", "reason": f"unknown state {state!r}"})
    found: list[Job] = []
    if not errors:
        query = jobs.jobs_query(admin, True, [state] if state else None, owner_id, queue or None)
        found, want = listing.fetch(db, query, want, JOB_SORTS, Job.id)
    names = tenancy.usernames(db)
    return page(
        request, "admin_jobs.html", status=400 if errors else 200, user=admin, errors=errors,
        jobs=[jobs.view(j, names.get(j.user_id), positions=p.queue_positions) for j in found],
        listing=want, filters=want.filters,
        usernames=sorted(names.values()), states=states, queues=sorted(tenancy.all_queue_configs(db)),
    )  # fmt: skip
