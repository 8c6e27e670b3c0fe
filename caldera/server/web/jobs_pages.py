"""Home (my jobs, my queues, free GPUs), the new-job forms, a job's page."""

from __future__ import annotations

import secrets
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, aliased

from caldera.core.spec import SpecError, parse_spec
from caldera.core.states import JobState
from caldera.db.models import Job, User
from caldera.images import catalogue, environments
from caldera.server import api_images, api_jobs, api_templates, arrays, job_publish, jobs, tenancy
from caldera.server.deps import db_session, platform
from caldera.server.errors import NotFound
from caldera.server.params import RowId
from caldera.server.platform import Platform
from caldera.server.web import api_call, governance_pages, gpu_use, job_forms, job_yaml, listing, overview, queue_view
from caldera.server.web.render import checked, page
from caldera.server.web.session import PageNotFound, page_user

router = APIRouter(include_in_schema=False)
HOME_CARDS = 50  # running and waiting jobs shown as cards, newest first
HOME_RECENT = 10  # the home page's table of recent jobs; the jobs page has them all
ACTIVE = [JobState.QUEUED.value, JobState.STARTING.value, JobState.RUNNING.value]
JOB_SORTS = {"submitted_at": Job.submitted_at, "name": Job.name, "kind": Job.kind, "queue": Job.queue,
             "state": Job.state}  # fmt: skip


def _my_jobs(request: Request, db: Session, user: User, size: int = 50) -> dict:
    """A page of my jobs as the URL sorts and filters them, an array's tasks as one row (its lowest index among
    those the filters keep, with the array's counts), the events their messages are rendered from, and the URL that
    refreshes the rows in place."""
    want = listing.parse(request, JOB_SORTS, "-submitted_at", ("state", "queue", "kind", "name"), size)
    task = aliased(Job)
    first_task = select(func.min(task.array_index)).where(task.array_id == Job.array_id, *_kept(task, user, want))
    query = select(Job).where(
        *_kept(Job, user, want), or_(Job.array_id.is_(None), Job.array_index == first_task.scalar_subquery())
    )
    mine, want = listing.fetch(db, query, want, JOB_SORTS, Job.id)
    counts = arrays.counts_of(db, [j.array_id for j in mine if j.array_id])
    grouped = {a: {"counts": c, "state": arrays.state_of(c), "size": sum(c.values())} for a, c in counts.items()}
    rows_url = "/partials/my-jobs?" + urlencode({**want.args, "page": want.page, "size": want.size})
    return {"jobs": mine, "arrays": grouped, "latest": jobs.current_events(db, mine), "listing": want,
            "rows_url": rows_url}  # fmt: skip


def _kept(job: Any, user: User, want: listing.Listing) -> list[Any]:
    """The conditions of my jobs the URL's filters keep, on the jobs table or an alias of it."""
    state, queue, kind, name = (want.filters[k] for k in ("state", "queue", "kind", "name"))
    kept = [job.user_id == user.id]
    for column, value in ((job.state, state), (job.queue, queue), (job.kind, kind)):
        if value:
            kept.append(column == value)
    if name:
        kept.append(job.name.contains(name, autoescape=True))
    return kept


@router.get("/")
def home(request: Request, user: User = Depends(page_user), p: Platform = Depends(platform), db=Depends(db_session)):
    nodes = overview.nodes_now(p, db, user)
    queues = [{**q, "largest_now": overview.largest_now(nodes, q)} for q in overview.my_queues(db, user)]
    active = jobs.list_jobs(db, user, states=ACTIVE, limit=HOME_CARDS)
    recent = _my_jobs(request, db, user, HOME_RECENT)
    return page(
        request, "home.html", user=user, queues=queues, gpus=overview.free_gpus(nodes), active=active,
        gpu_use=gpu_use.running_jobs_use(p.settings, active), gov_notices=governance_pages.notices(db, active),
        advice=governance_pages.advice_of(db, recent["jobs"]), **recent,
    )  # fmt: skip


@router.get("/jobs")
def my_jobs(request: Request, user: User = Depends(page_user), db: Session = Depends(db_session)):
    """All my jobs, a page at a time, sorted and filtered as the URL says."""
    queues = sorted({q["queue"] for q in overview.my_queues(db, user)})
    states = [s.value for s in JobState]
    return page(
        request, "my_jobs.html", user=user, queues=queues, states=states, kinds=job_forms.KINDS,
        **_my_jobs(request, db, user),
    )  # fmt: skip


@router.get("/partials/my-jobs")
def my_jobs_rows(request: Request, user: User = Depends(page_user), db: Session = Depends(db_session)):
    """A job table's body (the home page's, the jobs page's), refreshed in place by HTMX."""
    return page(request, "_job_rows.html", **_my_jobs(request, db, user))


@router.get("/queue")
def queue_page(
    request: Request, user: User = Depends(page_user), p: Platform = Depends(platform), db=Depends(db_session)
):
    """What waits ahead of my jobs in my queues, and my fair-share standing."""
    return page(request, "queue.html", user=user, **queue_view.queue_view(db, user, p.queue_positions))


def form_page(
    request: Request, p: Platform, db: Session, user: User, kind: str, form, errors, status=200, yaml_text=""
):
    if kind not in job_forms.KINDS:
        raise PageNotFound()
    queues = overview.my_queues(db, user)
    choices = overview.queue_choices(p, queues)
    nodes = overview.nodes_now(p, db, user)
    largest = {q["queue"]: overview.largest_now(nodes, q) for q in queues}
    ready = environments.views(db, request.app.state.builds.builder.has, "ready")
    images = [e["ref"] for e in ready if e["present"]]
    images += [catalogue.reference(p.settings, i) for i in catalogue.usable(db, user) if i.state == "ready"]
    if form.image and form.image not in images:
        images.append(form.image)  # a clone's or a template's image, e.g. one of the host's: the API judges it
    return page(
        request,
        "new_job.html",
        status=status,
        user=user,
        kind=kind,
        kinds=job_forms.KINDS,
        form=form,
        errors=errors,
        choices=choices,
        models=sorted({m for c in choices for m in c.models}),
        max_gpu=max((c.max_gpu for c in choices), default=0),
        priorities=job_forms.PRIORITIES,
        images=images,
        yaml_text=yaml_text,
        largest=largest,
    )


def _default_queue(db: Session, user: User) -> str:
    """What an empty form starts with: the default queue of my default account (the one I switched to)."""
    if not user.default_account:
        return ""
    try:
        return tenancy.default_queue(db, user.default_account)
    except NotFound:
        return ""


@router.get("/new/{kind}")
def new_job(
    request: Request,
    kind: str,
    clone: str = "",
    template: RowId | None = None,
    image: str = Query("", max_length=512),
    user=Depends(page_user),
    p=Depends(platform),
    db=Depends(db_session),
):
    """An empty form; with ?clone=<job id> one filled from a job the user may see, with ?template=<id> from a
    template of theirs or shared with one of their accounts (the template's kind wins), with ?image=<reference>
    one that runs in that image (the images page's "start a session")."""
    form = job_forms.JobForm(queue=_default_queue(db, user), image=image)
    if clone:
        form = job_forms.form_of(visible_job(db, user, clone).spec)
    elif template is not None:
        try:
            t = api_templates.visible(db, user, template)
        except NotFound:
            raise PageNotFound() from None
        form, kind = job_forms.form_of(t.spec), t.kind
    return form_page(request, p, db, user, kind, form, {})


def _submit(p: Platform, db: Session, user: User, body: dict) -> tuple[str | None, list[dict[str, str]]]:
    """The new job's id through the API's own validation and rules, or the API's errors."""
    created, errors = api_call.call(db, lambda: api_jobs.submit(spec=parse_spec(body), user=user, p=p, db=db))
    return (created["id"] if created else None), errors


def form_body(p: Platform, db: Session, user: User, kind: str, form: job_forms.JobForm):
    """The API body of a job form, with the user's queues deciding the account; and the form's own errors."""
    return job_forms.body_of(kind, form, overview.queue_choices(p, overview.my_queues(db, user)))


@router.post("/new/{kind}")
def submit_job(
    request: Request,
    kind: str,
    form: Annotated[job_forms.JobForm, Form()],
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    body, errors = form_body(p, db, user, kind, form)
    if not errors:
        job_id, errors = _submit(p, db, user, body)
        if job_id:
            return RedirectResponse(f"/jobs/{job_id}", 303)
    return form_page(request, p, db, user, kind, form, job_forms.by_field(errors), status=400)


@router.post("/new/{kind}/check")
def check_form(
    request: Request,
    kind: str,
    form: Annotated[job_forms.JobForm, Form()],
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """The errors a submit of the form would meet, by field, recording nothing: the same code as the submit's."""
    if kind not in job_forms.KINDS:
        raise PageNotFound()
    body, errors = form_body(p, db, user, kind, form)
    if not errors:
        _, errors = api_call.call(db, lambda: jobs.admissible(p, db, user, parse_spec(body)))
    return checked(request, job_forms.by_field(errors))


def _yaml_file(text: str, name: str) -> Response:
    return Response(
        text,
        media_type="text/plain; charset=utf-8",  # shown by the browser, not run; saved as .yaml through the link
        headers={"Content-Disposition": f'inline; filename="{name}.yaml"', "X-Content-Type-Options": "nosniff"},
    )


@router.post("/new/{kind}/yaml")
def export_form(
    request: Request,
    kind: str,
    form: Annotated[job_forms.JobForm, Form()],
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """The form as the YAML `caldera submit` takes; a form the API's spec rules refuse comes back with its errors."""
    body, errors = form_body(p, db, user, kind, form)
    if not errors:
        try:
            return _yaml_file(job_yaml.dump(parse_spec(body).model_dump(mode="json")), form.name or "job")
        except SpecError as exc:
            errors = exc.errors
    return form_page(request, p, db, user, kind, form, job_forms.by_field(errors), status=400)


@router.post("/new/{kind}/import")
def import_yaml(
    request: Request,
    kind: str,
    yaml_text: str = Form("", alias="yaml", max_length=job_yaml.MAX_YAML_CHARS),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """A YAML job file becomes the form of its kind, filled in, to check and submit."""
    try:
        spec = job_yaml.load(yaml_text)
    except SpecError as exc:
        errors = {"yaml": [{**e, "at": e["field"]} for e in exc.errors]}  # shown as "<field in the file>: reason"
        return form_page(request, p, db, user, kind, job_forms.JobForm(), errors, 400, yaml_text)
    form = job_forms.form_of(spec.model_dump(mode="json"))
    return form_page(request, p, db, user, spec.kind.value, form, {})


def visible_job(db: Session, user: User, job_id: str):
    try:
        return jobs.visible(db, user, job_id[:64])
    except NotFound:
        raise PageNotFound() from None


def _status(db: Session, user: User, job) -> dict:
    return {
        "job": job,
        "events": jobs.events(db, job),
        "current": jobs.current_events(db, [job]).get(job.id),
        "terminal": JobState(job.state).terminal,
        "mine": job.user_id == user.id,
    }


def _output_folder(p: Platform, user: User, job) -> str | None:
    """Where a succeeded job of mine worked, as a path of my workspace: what its page offers to publish; None
    for any other job."""
    if job.user_id != user.id or job.state != JobState.SUCCEEDED.value:
        return None
    try:
        return job_publish.in_workspace(p, user, job, "")
    except ValueError:  # a working directory outside the workspace: nothing the workspace can name
        return None


def _job_page(request: Request, p: Platform, db: Session, user: User, job, errors=(), status: int = 200):
    ranks = job.spec.get("replicas", 1) * job.spec.get("procs_per_replica", 1)
    # the terminal's xterm.js styles itself with <style> elements, marked with this response's nonce
    terminal = job.user_id == user.id and job.state == JobState.RUNNING.value
    return page(
        request, "job.html", status=status, user=user, ranks=ranks, errors=list(errors),
        snapshots=p.settings.runtime == "container", style_nonce=secrets.token_urlsafe(16) if terminal else "",
        output_folder=_output_folder(p, user, job),
        **_status(db, user, job),
        **governance_pages.job_context(db, user, job),
    )  # fmt: skip


def job_page_with_errors(request: Request, p: Platform, db: Session, user: User, job_id: str, errors):
    return _job_page(request, p, db, user, visible_job(db, user, job_id), errors, status=400)


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: str, user=Depends(page_user), p=Depends(platform), db=Depends(db_session)):
    return _job_page(request, p, db, user, visible_job(db, user, job_id))


@router.post("/jobs/{job_id}/snapshot")
def save_as_image(
    request: Request,
    job_id: str,
    name: str = Form("session", max_length=64),
    tag: str = Form("", max_length=64),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """A running Jupyter session of mine saved as an image, by the API's snapshot route and its rules; the images
    page then follows its log. A refusal comes back on the job's page."""
    job = visible_job(db, user, job_id)

    def save() -> dict:
        body = api_images.SnapshotForm(job_id=job.id, name=name, tag=tag.strip() or None)
        return api_images.save_session(body=body, user=user, p=p, q=request.app.state.builds, db=db)

    saved, errors = api_call.call(db, save)
    if saved:
        return RedirectResponse(f"/images#build-{saved['id']}", 303)
    return _job_page(request, p, db, user, visible_job(db, user, job_id), errors, status=400)


@router.get("/jobs/{job_id}/partials/status")
def job_status(request: Request, job_id: str, user: User = Depends(page_user), db: Session = Depends(db_session)):
    """State, why pending and the events, refreshed in place by HTMX."""
    return page(request, "_job_status.html", **_status(db, user, visible_job(db, user, job_id)))


@router.get("/jobs/{job_id}/job.yaml")
def job_as_yaml(job_id: str, user: User = Depends(page_user), db: Session = Depends(db_session)):
    job = visible_job(db, user, job_id)
    return _yaml_file(job_yaml.dump(job_yaml.body_of_job(job)), job.name)


@router.post("/jobs/{job_id}/cancel")
def cancel_job(job_id: str, user: User = Depends(page_user), p=Depends(platform), db: Session = Depends(db_session)):
    visible_job(db, user, job_id)
    api_jobs.cancel(job_id=job_id, user=user, p=p, db=db)
    return RedirectResponse(f"/jobs/{job_id}", 303)


@router.post("/jobs/{job_id}/resubmit")
def resubmit_job(
    request: Request, job_id: str, user: User = Depends(page_user), p=Depends(platform), db=Depends(db_session)
):
    """A finished job of one's own again, as a new job with the same spec, account and queue. Only the owner's:
    an admin resubmitting someone's job would run their command as the admin. If the API refuses it now (a queue
    gone, a cap lowered), the form opens with the job and the API's errors."""
    job = visible_job(db, user, job_id)
    if job.user_id != user.id or not JobState(job.state).terminal:
        raise PageNotFound()
    new_id, errors = _submit(p, db, user, job_yaml.body_of_job(job))
    if new_id:
        return RedirectResponse(f"/jobs/{new_id}", 303)
    form = job_forms.form_of(job.spec)
    return form_page(request, p, db, user, job.kind, form, job_forms.by_field(errors), status=400)
