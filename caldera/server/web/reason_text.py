"""What the platform says about jobs, in the reader's language: state, kind and priority labels, the scheduler's
pending reasons, job events and the API's field errors.

Reasons and events carry a code and the values their English message was made from (``details``; an event's
``details`` column). Each known code has one catalogue message with named placeholders, plus optional clauses
appended when their value is there; a code we do not know, or one whose values are missing (an event stored before
events had details, a reason from another scheduler), is shown as the English message it came with. The values
stay in the forms and URLs; only what is shown changes.

Field errors: our own carry a ``code`` and ``params`` (``caldera/server/errors.py``); pydantic's English messages
are matched by shape (``SHAPES``), their values kept. Anything else is shown as the API said it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from caldera.scheduler.reasons import hhmm, num

Gettext = Callable[[str], str]
_ = str  # marks msgids for extraction (babel.cfg); the real translation happens when a page renders

STATES = {
    "Pending": _("Pending"),
    "Queued": _("Queued"),
    "Starting": _("Starting"),
    "Running": _("Running"),
    "Succeeded": _("Succeeded"),
    "Failed": _("Failed"),
    "Cancelled": _("Cancelled"),
    "Preempted": _("Preempted"),
    "Lost": _("Lost"),
}
KINDS = {"batch": _("batch"), "distributed": _("distributed"), "jupyter": _("Jupyter"), "vscode": _("VS Code")}
PRIORITIES = {"high": _("high"), "normal": _("normal"), "low": _("low"), "best-effort": _("best-effort")}
USER_CAPS = {
    "max_gpus": _("GPUs"),
    "max_interactive_jobs": _("interactive jobs"),
    "max_running_jobs": _("running jobs"),
}


class Message:
    """One code's catalogue message, and clauses ``(detail, msgid)`` appended when that detail has a value."""

    def __init__(self, msgid: str, *clauses: tuple[str, str]):
        self.msgid = msgid
        self.needs = set(re.findall(r"%\((\w+)\)s", msgid))
        self.clauses = clauses

    def render(self, values: Mapping[str, Any], gettext: Gettext) -> str | None:
        if any(values.get(k) is None for k in self.needs):
            return None
        text = gettext(self.msgid) % values
        for key, msgid in self.clauses:
            if values.get(key) not in (None, "", 0):
                text += gettext(msgid) % values
        return text


# the scheduler's reason codes (caldera/scheduler/reasons.py), from their details
PENDING: dict[str, Message] = {
    "QueuePosition": Message(
        _("position %(position)s in the queue"),
        ("blocked_by", _(", behind %(blocked_by)s")),
        ("estimated_start", _(", estimated start at %(estimated_start)s")),
    ),
    "QueueCapability": Message(
        _("queue at its capability for %(resource)s (%(used)s of %(limit)s used)"),
        ("requested", _(", this job needs %(requested)s")),
    ),
    "UserCap": Message(
        _("user cap of %(limit)s %(cap)s reached"),
        ("requested", _(" (%(used)s in use, this job needs %(requested)s)")),
    ),
    "GangNoFit": Message(
        _(
            "needs %(replicas)s × %(gpus_per_replica)s GPUs (%(gpu_model)s) on one node each; %(free_gpus)s are free "
            "and the largest free block on a node is %(largest_free_block)s"
        ),
        ("unschedulable_nodes", _("; not schedulable (cordoned): %(unschedulable_nodes)s")),
    ),
    "Reserved": Message(
        _(
            "resources reserved for it: expected to start at %(reserved_start)s on %(nodes)s as running jobs reach "
            "their runtime limits"
        )
    ),
    "BackfillBlocked": Message(
        _("would fit now, but the free resources are reserved for job %(reserved_for)s from %(reserved_start)s"),
        ("max_runtime_s", _(" and its run time (%(max_runtime_s)s s) ends after that")),
    ),
    "WaitingForPreemption": Message(_("waiting for preempted jobs (%(victims)s) to release their resources")),
    "BestEffortNoIdle": Message(
        _(
            "best-effort jobs run only on idle capacity: %(free_gpus)s GPUs (%(gpu_model)s) are idle and the "
            "largest idle block on a node is %(largest_free_block)s"
        )
    ),
    "NeverFits": Message(
        _("cannot be placed: %(replicas)s × %(gpus_per_replica)s GPUs (%(gpu_model)s) fit no schedulable node")
    ),
    # the cluster's reasons (runtime/kubernetes): Kueue's and kube-scheduler's own words are kept as a value
    "AwaitingAdmission": Message(_("waiting for Kueue to admit the job in its queue")),
    "KueueInsufficientQuota": Message(
        _("Kueue: not enough quota in its queue now"),
        ("resources", _(" (short of %(resources)s in %(flavors)s)")),
        ("message", _("; Kueue says: %(message)s")),
    ),
    "KueuePending": Message(_("Kueue has not admitted it yet"), ("message", _("; Kueue says: %(message)s"))),
    "KueueWaitingForPodsReady": Message(_("admitted by Kueue; waiting for all its pods to start (all or nothing)")),
    "KueueEvicted": Message(_("evicted by Kueue and re-queued"), ("message", _("; Kueue says: %(message)s"))),
    "KueueInactive": Message(_("deactivated by Kueue"), ("message", _("; Kueue says: %(message)s"))),
    "Unschedulable": Message(
        _("kube-scheduler cannot place pod %(pod)s"), ("message", _("; kube-scheduler says: %(message)s"))
    ),
    "EvictionBackoff": Message(
        _(
            "backing off: evicted %(evictions)s times in a row (its pods did not all start in time); it goes to "
            "Kueue again at %(retry_at)s"
        ),
        ("unschedulable", _("; kube-scheduler: %(unschedulable)s")),
    ),
    "HeldNoNodeFits": Message(
        _(
            "held: evicted %(evictions)s times in a row (its pods did not all start in time); it goes to Kueue again "
            "when the cluster's nodes change, or cancel it and submit it changed"
        ),
        ("unschedulable", _("; kube-scheduler: %(unschedulable)s")),
    ),
    "KueueGpuTotalUsedUp": Message(  # Kueue, for a queue's model-less GPU quota (caldera/runtime/kubernetes/kueue.py)
        _("the queue's GPU quota, a total over every GPU model, is used up"),
        ("in_use", _(" (%(in_use)s of %(quota)s GPUs in use)")),
        ("needed", _(": this job needs %(needed)s more GPUs")),
    ),
    "SharingDeclined": Message(
        _("not shared: no occupied GPU where its predicted slowdown stays within its tolerance (%(tolerance)s)")
    ),
    # kept from the scheduler by the platform (caldera/server/holds.py)
    "Held": Message(_("held by %(by)s"), ("note", _(": %(note)s"))),
    "Dependency": Message(
        _("waiting for job %(job)s to end (it is %(state)s)"), ("must_succeed", _("; it must succeed"))
    ),
    "ArrayLimit": Message(_("array %(array)s already runs %(limit)s tasks, its limit (%%%(limit)s)")),
}

# the reasons of job events the platform writes itself (caldera/server/jobs.py, loop.py), from their details
EVENTS: dict[str, Message] = {
    "Submitted": Message(_("submitted by %(user)s")),
    "Admitted": Message(_("queued in %(queue)s")),
    "Scheduled": Message(_("attempt %(attempt)s on %(where)s")),
    "Completed": Message(_("exited with code %(exit_code)s")),
    "ExitCode": Message(_("exited with code %(exit_code)s")),
    "Stopped": Message(_("exited with code %(exit_code)s after a stop request")),
    "OutOfMemory": Message(_("exited with code %(exit_code)s: killed at its memory limit")),
    "Killed": Message(_("killed (exit code %(exit_code)s): most likely out of memory")),
    "ProcessGone": Message(_("its processes vanished without an exit status")),
    "ContainerGone": Message(_("its container disappeared")),
    "MountsUnsupported": Message(_("this runtime cannot mount storage spaces into jobs")),
    "MountPointRefused": Message(_("this runtime cannot mount a storage space there: %(error)s")),
    "MountSourceRefused": Message(_("this runtime cannot mount that storage: %(error)s")),
    "NotFound": Message(_("this attempt was never launched completely")),
    "CancelRequested": Message(_("cancelled by %(by)s; SIGTERM, SIGKILL after %(grace_s)s s")),
    "CancelledByUser": Message(_("cancelled by %(by)s")),
    "PreemptionRequested": Message(_("%(cause)s; SIGTERM now, SIGKILL at %(deadline)s")),
    "Reclaim": Message(_("preempted for job %(by)s: its queue takes back its guaranteed share")),
    "BestEffort": Message(_("preempted for job %(by)s: best-effort jobs give way to all others")),
    "Priority": Message(_("preempted for job %(by)s, which has a higher priority")),
    "LeastAttainedService": Message(_("preempted for job %(by)s: jobs with less attained service go first")),
    "NodeDrained": Message(_("node %(node)s is drained by an admin"), ("note", _(": %(note)s"))),
    "Requeued": Message(_("re-queued after preemption; same working directory")),
    "Held": Message(_("held by %(by)s"), ("note", _(": %(note)s"))),
    "Released": Message(_("released by %(by)s")),
    "RequeuedByAdmin": Message(_("requeued by admin %(admin)s"), ("note", _(": %(note)s"))),
    "DependencyFailed": Message(_("its dependency %(job)s ended %(state)s, and it needed it to succeed")),
    "Reattached": Message(_("server restarted; processes still running (%(runtime)s runtime)")),
    "Unobservable": Message(
        _("cannot observe attempt %(attempt)s: %(error)s; its devices stay held until its processes are found ended")
    ),
    "Running": Message(_("all processes running"), ("detail", _(" (%(detail)s)"))),
    "Profiled": Message(
        _("solo profile of its first %(window_s)s s alone on %(node)s GPU %(gpu)s (%(gpu_model)s)"),
        ("gpu_util", _("; GPU utilisation %(gpu_util)s%%")),
        ("sm_active", _("; SM active %(sm_active)s%%")),
        ("cpu", _("; CPU %(cpu)s%% of a core")),
        ("memory_mib", _("; peak memory %(memory_mib)s MiB")),
    ),
    "Preempted": Message(_("preempted by the cluster's admission (Kueue)"), ("detail", _(": %(detail)s"))),
    "Evicted": Message(_("evicted by the cluster (Kueue) and re-queued"), ("detail", _(": %(detail)s"))),
    # governance (caldera/server/governor.py, caldera/governance/requests.py)
    "IdleWarning": Message(_("its GPUs averaged %(percent)s%% over %(window)s; stopped in %(grace)s unless used")),
    "IdleFlagged": Message(_("its GPUs averaged %(percent)s%% over %(window)s")),
    "IdleCleared": Message(_("its GPUs are in use again: it is not stopped")),
    "IdleSnapshot": Message(_("saving the session as %(snapshot)s before stopping it")),
    "IdleSnapshotFailed": Message(_("could not save the session: %(error)s")),
    "IdleStopped": Message(
        _("stopped: its GPUs stayed idle for %(window)s and %(grace)s after the warning"),
        ("snapshot", _("; the session was saved as %(snapshot)s")),
    ),
    "RuntimeLimitWarning": Message(_("stops at its runtime limit in %(left)s")),
    "RuntimeLimitReached": Message(_("stopped at its runtime limit of %(limit)s")),
    "ExtendRequested": Message(_("%(user)s asks to extend it by %(duration)s: %(reason)s")),
    "LockRequested": Message(_("%(user)s asks to lock it for %(duration)s: %(reason)s")),
    "ExtendApproved": Message(_("extended by %(duration)s, approved by %(by)s")),
    "LockApproved": Message(_("locked against idle stopping for %(duration)s, approved by %(by)s")),
    "ExtendDeclined": Message(_("%(by)s declined the extension"), ("note", _(": %(note)s"))),
    "LockDeclined": Message(_("%(by)s declined the lock"), ("note", _(": %(note)s"))),
    "LockExpired": Message(_("its lock expired: idle GPUs may stop it again")),
    # launch failures (LaunchError codes of the runtimes): the runtime's own words are kept as a value
    "LaunchFailed": Message(_("could not be launched: %(error)s")),
    "RuntimeUnavailable": Message(_("its runtime is not available: %(error)s")),
    "BadWorkdir": Message(_("its working directory cannot be used: %(error)s")),
    "StartFailed": Message(_("could not start: %(error)s")),
    "SpawnFailed": Message(_("could not start its command: %(error)s")),
    "SpawnError": Message(_("could not start its command"), ("detail", _(": %(detail)s"))),
    "StoppedBeforeStart": Message(_("stopped before its command started")),
    "NoCommand": Message(_("it has no command to run: %(error)s")),
    "ImageNotFound": Message(_("its image was not found: %(error)s")),
    "CommandNotFound": Message(_("its command is not in its image: %(error)s")),
    "ShellNotInImage": Message(_("its image has no shell: %(error)s")),
    "JupyterNotInImage": Message(_("its image has no JupyterLab: %(error)s")),
    "CodeServerMissing": Message(_("VS Code's code-server is not installed where the runtime looks: %(error)s")),
    "KindUnsupported": Message(_("its runtime does not run jobs of this kind: %(error)s")),
    "AlreadyRunning": Message(_("this attempt was already running: %(error)s")),
    "AlreadyLaunching": Message(_("this attempt was already being launched: %(error)s")),
    "BadJobId": Message(_("the runtime refused its id: %(error)s")),
    "SupervisorFailed": Message(_("its supervisor ended before the command started: %(error)s")),
    "StartTimeout": Message(_("its ranks did not start in time: %(error)s")),
    "ReattachFailed": Message(
        _("could not re-attach: %(error)s; every process of attempt %(attempt)s was found and ended")
    ),
    # its spec's publish (caldera/server/job_publish.py)
    "Published": Message(_("its folder %(path)s was published as model %(ref)s")),
    "PublishFailed": Message(_("its folder %(path)s was not published as model %(model)s: %(error)s")),
}

# our own field errors (InvalidFields rows with a code), from their params
ERRORS: dict[str, Message] = {
    "NoAccount": Message(_("you belong to no account; ask an admin to add you to one")),
    "UnknownAccount": Message(_("unknown account %(account)s")),
    "NotAMember": Message(_("you are not a member of account %(account)s")),
    "UnknownQueue": Message(_("unknown queue %(queue)s")),
    "QueueOfAnotherAccount": Message(_("queue %(queue)s belongs to account %(owner)s, not %(account)s")),
    "OverUserGpuCap": Message(
        _("the job needs %(gpus)s GPUs but queue %(queue)s caps each user at %(limit)s (user_caps.max_gpus)")
    ),
    "NoRunningJobs": Message(_("queue %(queue)s lets no user run jobs (user_caps.max_running_jobs is 0)")),
    "NoInteractiveJobs": Message(_("queue %(queue)s allows no interactive jobs (user_caps.max_interactive_jobs is 0)")),
    "OverCapability": Message(
        _(
            "the job needs %(amount)s %(resource)s but queue %(queue)s can never use more than %(capability)s (its "
            "capability for %(resource)s)"
        )
    ),
    "UnknownDependency": Message(_("no job %(job)s")),
    "BadArray": Message(_("not a job array's indices: %(error)s")),
    "NotKeyValue": Message(_("%(line)s: expected KEY=VALUE")),
    "CudnnNeedsCuda": Message(_("cuDNN %(cudnn)s needs CUDA %(needs)s.x; choose one")),
    "CudnnCudaMismatch": Message(_("cuDNN %(cudnn)s is built for CUDA %(needs)s.x, not CUDA %(cuda)s")),
    "TorchNotForCuda": Message(_("PyPI publishes no torch for CUDA %(cuda)s (choose CUDA 11.7 or 12.x for torch)")),
    "TorchNotForPython": Message(
        _("%(torch)s (CUDA %(cuda)s) has no wheel for Python %(python)s; choose Python %(pythons)s")
    ),
    "TorchCudnnMismatch": Message(
        _("%(torch)s (CUDA %(cuda)s) brings its own cuDNN, not %(cudnn)s; choose cuDNN %(cudnns)s")
    ),
    "BaseImageMissing": Message(
        _(
            "Python %(python)s needs the %(base)s base image, not on this host; an admin makes it with `caldera "
            "images bootstrap --suite %(suite)s`"
        )
    ),
    "BaseNotOffered": Message(_("no base %(base)s among the images you may build on (GET /api/v1/images/bases)")),
    "BaseMissing": Message(_("%(base)s is not on this host; an admin makes it with `%(command)s`")),
    # governance requests (caldera/server/approvals.py)
    "OnlyOwnerAsks": Message(_("only the job's owner asks to extend or lock it")),
    "NotAskable": Message(_("job %(job)s is %(state)s: only a queued or running job can be extended or locked")),
    "CordonedNoLock": Message(_("job %(job)s runs on node %(node)s, which is cordoned: it cannot be locked")),
    "RequestPending": Message(_("request %(request)s about job %(job)s is still waiting for a decision")),
    "NotDecider": Message(_("an admin of the job's account or a platform admin decides this request")),
    "AlreadyDecided": Message(_("request %(request)s is already decided")),
    # storage (caldera/server/api_files.py, caldera/server/catalogue)
    "SpaceInUse": Message(_("%(space)s is in use by running jobs %(jobs)s: delete it once they end")),
    "CatalogueEntriesFull": Message(
        _("you have %(limit)s versions in the catalogue, the most one user may have: delete one first")
    ),
    "CatalogueBytesFull": Message(
        _("your catalogue versions may take %(limit)s bytes together and take %(used)s: this folder does not fit")
    ),
    # a publish's copy in the background (caldera/server/catalogue_copies.py)
    "PublishSourceGone": Message(_("the folder %(source)s is gone")),
    "PublishCopyFailed": Message(_("the copy failed: %(error)s")),
    # imports of a Hugging Face-style repository (caldera/storage/hub.py)
    "HubBadSource": Message(
        _(
            "not a repository: hf://OWNER/REPO[@REVISION] for a model, hf://datasets/OWNER/REPO[@REVISION] for a "
            "dataset (letters, digits and ._-)"
        )
    ),
    "HubNoMirror": Message(_("no Hugging Face mirror is configured: an admin sets huggingface_mirror_url")),
    "NotAccountAdmin": Message(_("the low-utilisation list is for admins and account admins")),
    "PriorityNeedsGrant": Message(
        _(
            "priority %(priority)s needs a grant in queue %(queue)s: you may submit up to %(granted)s there; an "
            "admin grants more with `caldera queue grant %(queue)s %(user)s %(priority)s`"
        )
    ),
}

# right-sizing advice from a finished job's metrics (caldera/governance/advice.py), from its values
ADVICE: dict[str, Message] = {
    "UnusedGpus": Message(_("its %(asked)s GPUs averaged %(percent)s%% utilisation: it needs no GPU")),
    "FewerGpus": Message(_("asked for %(asked)s GPUs and used %(used)s: ask for %(used)s next time")),
    "SmallGpuMemory": Message(_("peak GPU memory %(peak_gib)s GiB of %(total_gib)s: a shareable request fits")),
    "CpuBound": Message(
        _("CPU-bound: GPU utilisation %(gpu_percent)s%%, CPU %(cores)s of the %(asked)s cores it asked for")
    ),
}

# pydantic's English messages (and a few of our older ones) by shape; named groups fill the placeholders
SHAPES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern + r"\Z", re.S), msgid)
    for pattern, msgid in (
        (r"Field required", _("required")),
        (r"String should match pattern '(?P<pattern>.*)'", _("must match the pattern %(pattern)s")),
        (r"String should have at most (?P<n>\d+) characters?", _("at most %(n)s characters")),
        (r"String should have at least (?P<n>\d+) characters?", _("at least %(n)s characters")),
        (r"Input should be greater than or equal to (?P<n>\S+)", _("must be at least %(n)s")),
        (r"Input should be greater than (?P<n>\S+)", _("must be greater than %(n)s")),
        (r"Input should be less than or equal to (?P<n>\S+)", _("must be at most %(n)s")),
        (r"Input should be a valid integer.*", _("must be a whole number")),
        (r"Input should be a valid number.*", _("must be a number")),
        (r"Input should be a valid boolean.*", _("must be true or false")),
        (r"Extra inputs are not permitted", _("is not a known field")),
        (r"Input should be (?P<choices>'[^']*'(?:, '[^']*')*(?: or '[^']*')?)", _("must be one of %(choices)s")),
        (
            r"(?:Value error, )?invalid environment variable name (?P<name>.*): use ASCII letters, digits and _, "
            r"not starting with a digit",
            _("invalid environment variable name %(name)s: use ASCII letters, digits and _, not starting with a digit"),
        ),
        (
            r"(?:Value error, )?the value of (?P<name>\w+) contains a NUL byte, which no environment can hold",
            _("the value of %(name)s contains a NUL byte, which no environment can hold"),
        ),
        # the catalogue's image resolution (caldera/images/catalogue.py)
        (
            r"no image (?P<name>.*) in the catalogue; `caldera images list` shows the images you may run",
            _("no image %(name)s in the catalogue; `caldera images list` shows the images you may run"),
        ),
        (
            r"no image (?P<name>.*) among the images you may run; `caldera images list` shows them",
            _("no image %(name)s among the images you may run; `caldera images list` shows them"),
        ),
        (
            r"image (?P<name>.*) is not yours to use \((?P<visibility>[a-z]+)\)",
            _("image %(name)s is not yours to use (%(visibility)s)"),
        ),
        (
            r"(?P<name>.*) names several images you may run \((?P<names>.*)\); name one of them",
            _("%(name)s names several images you may run (%(names)s); name one of them"),
        ),
        # the image build form (caldera/images/form.py, instructions.py): the line or package is kept as typed
        (
            r"Value error, (?P<value>'.*'|\".*\") is not a pip requirement \(.*\)",
            _("%(value)s is not a pip requirement (a name, [extras] and version conditions; no spaces or URLs)"),
        ),
        (
            r"Value error, (?P<value>'.*'|\".*\") is not a Debian package name \(optionally =version\)",
            _("%(value)s is not a Debian package name (optionally =version)"),
        ),
        (
            r"Value error, (?P<line>'.*'|\".*\"): each line is one line of at most (?P<n>\d+) characters",
            _("%(line)s: each line is one line of at most %(n)s characters"),
        ),
        (
            r"Value error, (?P<line>'.*'|\".*\"): a line holds no control characters .*",
            _("%(line)s: a line holds no control characters (no newline: each line is one instruction)"),
        ),
        (
            r"Value error, (?P<line>'.*'|\".*\"): each line is one (?P<allowed>[A-Z/]+) instruction followed by its "
            r"arguments",
            _("%(line)s: each line is one %(allowed)s instruction followed by its arguments"),
        ),
        (
            r"Value error, (?P<line>'.*'|\".*\"): no continuation: a line may not end with \\",
            _("%(line)s: no continuation: a line may not end with \\"),
        ),
        (
            r"Value error, (?P<line>'.*'|\".*\"): (?P<instruction>[A-Z]+) takes no flags \((?P<flag>.*)\): .*",
            _(
                "%(line)s: %(instruction)s takes no flags (%(flag)s): --mount, --network, --security, --device and all "
                "others are refused"
            ),
        ),
        (
            r"Value error, (?P<line>'.*'|\".*\"): RUN \[.*\] must be a JSON list of strings",
            _('%(line)s: RUN ["program", "argument", ...] must be a JSON list of strings'),
        ),
        (
            r"Value error, (?P<line>'.*'|\".*\"): RUN takes no heredoc \(<<WORD\)",
            _("%(line)s: RUN takes no heredoc (<<WORD)"),
        ),
        (
            r"Value error, (?P<line>'.*'|\".*\"): (?P<instruction>[A-Z]+) has an unclosed quote",
            _("%(line)s: %(instruction)s has an unclosed quote"),
        ),
        (
            r"Value error, (?P<line>'.*'|\".*\"): (?P<instruction>[A-Z]+) takes NAME=value pairs; (?P<name>.*) is "
            r"not a valid name",
            _("%(line)s: %(instruction)s takes NAME=value pairs; %(name)s is not a valid name"),
        ),
        (
            r"Value error, (?P<line>'.*'|\".*\"): labels (?P<prefix>\S+)\* are the platform's",
            _("%(line)s: labels %(prefix)s* are the platform's"),
        ),
        (
            r"Value error, (?P<line>'.*'|\".*\"): WORKDIR takes one absolute path of letters, digits and \._/@\+-",
            _("%(line)s: WORKDIR takes one absolute path of letters, digits and ._/@+-"),
        ),
        (
            r"List should have at most (?P<n>\d+) items? after validation, not (?P<got>\d+)",
            _("at most %(n)s items, not %(got)s"),
        ),
        (r"Value error, a (?P<kind>\w+) job needs a command", _("a %(kind)s job needs a command")),
        (
            r"Value error, publish applies to batch and distributed jobs: a (?P<kind>\w+) session has no end that "
            r"says its output is ready \(publish its folder from the portal's Files page\)",
            _(
                "publish applies to batch and distributed jobs: a %(kind)s session has no end that says its output is "
                "ready (publish its folder from the portal's Files page)"
            ),
        ),
        (
            r"Value error, replicas and procs_per_replica apply to distributed jobs only",
            _("replicas and processes per replica apply to distributed jobs only"),
        ),
        # the scheduler's never_fits (caldera/scheduler/quota.py), refused at submission
        (r"a job needs at least one replica", _("a job needs at least one replica")),
        (r"the cluster has no nodes", _("the cluster has no nodes")),
        # the datasets and models catalogue and imports (caldera/storage/catalogue.py, api_catalogue.py)
        (r"(?:dataset|model) (?P<ref>\S+) exists already", _("%(ref)s exists already in the catalogue")),
        (
            r"(?:dataset|model) (?P<name>\S+) is another user's: publish under a name of your own",
            _("%(name)s is another user's: publish under a name of your own"),
        ),
        (r"(?P<path>'.*'|\".*\") already exists", _("%(path)s already exists")),
        (r"you may read (?P<space>\S+) but not change it", _("you may read %(space)s but not change it")),
        # an import's failure, as its thread stored it (caldera/storage/fetch.py, caldera/storage/hub.py)
        (r"larger than the (?P<n>\d+) bytes it may bring", _("larger than the %(n)s bytes it may bring")),
        (r"the server answered (?P<status>.*)", _("the server answered %(status)s")),
        (
            r"no Hugging Face mirror is configured: an admin sets huggingface_mirror_url",
            _("no Hugging Face mirror is configured: an admin sets huggingface_mirror_url"),
        ),
        (
            r"the mirror listed a file name that is refused: (?P<name>.*)",
            _("the mirror listed a file name that is refused: %(name)s"),
        ),
        (
            r"the mirror listed (?P<name>.*) twice, or as a file and a folder",
            _("the mirror listed %(name)s twice, or as a file and a folder"),
        ),
        (r"the mirror listed a file without a name", _("the mirror listed a file without a name")),
        (r"the repository has more than (?P<n>\d+) files", _("the repository has more than %(n)s files")),
        (r"the repository has no files", _("the repository has no files")),
        (r"the mirror's listing is not JSON", _("the mirror's listing is not JSON")),
        (
            r"the mirror's listing has no list of files \(siblings\)",
            _("the mirror's listing has no list of files (siblings)"),
        ),
        (
            r"the mirror's listing is larger than (?P<n>\d+) bytes",
            _("the mirror's listing is larger than %(n)s bytes"),
        ),
        (
            r"the repository's files take (?P<stated>\d+) bytes and the space has room for (?P<room>\d+)",
            _("the repository's files take %(stated)s bytes and the space has room for %(room)s"),
        ),
        (r"you have no access to (?P<space>\S+)", _("you have no access to %(space)s")),
        (r"the cluster has no GPUs", _("the cluster has no GPUs")),
        (
            r"no node has GPU model (?P<model>\S+) \(models present: (?P<models>.*)\)",
            _("no node has GPU model %(model)s (models present: %(models)s)"),
        ),
        (
            r"needs (?P<n>\d+) GPUs of one model per replica but the largest node has (?P<largest>\d+)",
            _("needs %(n)s GPUs of one model per replica but the largest node has %(largest)s"),
        ),
        (
            r"needs (?P<n>\d+) (?P<model>\S+) GPUs per replica but the largest node has (?P<largest>\d+)",
            _("needs %(n)s %(model)s GPUs per replica but the largest node has %(largest)s"),
        ),
        (
            r"needs (?P<n>\d+) GPUs of one model in all but the cluster has (?P<total>\d+)",
            _("needs %(n)s GPUs of one model in all but the cluster has %(total)s"),
        ),
        (
            r"needs (?P<n>\d+) (?P<model>\S+) GPUs in all but the cluster has (?P<total>\d+)",
            _("needs %(n)s %(model)s GPUs in all but the cluster has %(total)s"),
        ),
        (
            r"no node has (?P<gpus>\d+) GPUs, (?P<cpu>\S+) CPUs and (?P<mem>\d+) MiB of memory together for one "
            r"replica",
            _("no node has %(gpus)s GPUs, %(cpu)s CPUs and %(mem)s MiB of memory together for one replica"),
        ),
        (
            r"no node has (?P<cpu>\S+) CPUs and (?P<mem>\d+) MiB of memory together for one replica",
            _("no node has %(cpu)s CPUs and %(mem)s MiB of memory together for one replica"),
        ),
        (
            r"needs (?P<n>\d+) replicas but at most (?P<fit>\d+) fit on the whole cluster at once",
            _("needs %(n)s replicas but at most %(fit)s fit on the whole cluster at once"),
        ),
        (r"you are not a member of account (?P<account>.*)", _("you are not a member of account %(account)s")),
        (r"no node (?P<node>.*)", _("no node %(node)s")),
        (r"you cannot disable yourself", _("you cannot disable yourself")),
        (r"you cannot change your own role", _("you cannot change your own role")),
        (r"wrong current password", _("wrong current password")),
        (r"a public key is at most (?P<n>\d+) characters", _("a public key is at most %(n)s characters")),
        (r"this is a private key; paste the \.pub file", _("this is a private key; paste the .pub file")),
        (
            r"this is an RFC 4716 key; paste the OpenSSH form \(ssh-keygen -i -f FILE prints it\)",
            _("this is an RFC 4716 key; paste the OpenSSH form (ssh-keygen -i -f FILE prints it)"),
        ),
        (r"paste a public key", _("paste a public key")),
        (r"paste one key: this has several lines", _("paste one key: this has several lines")),
        (r"the key contains control characters", _("the key contains control characters")),
        (r"the name contains control characters", _("the name contains control characters")),
        (r"a name is at most (?P<n>\d+) characters", _("a name is at most %(n)s characters")),
        (
            r"options before the key \(from=, command=, \.\.\.\) are not accepted; paste the key alone",
            _("options before the key (from=, command=, ...) are not accepted; paste the key alone"),
        ),
        (r"unknown key type (?P<type>.*); one of (?P<types>.*)", _("unknown key type %(type)s; one of %(types)s")),
        (r"the key's base64 part is missing", _("the key's base64 part is missing")),
        (r"the key's base64 part is not valid base64", _("the key's base64 part is not valid base64")),
        (
            r"the key says (?P<declared>\S+) but its data is a (?P<inner>.*) key",
            _("the key says %(declared)s but its data is a %(inner)s key"),
        ),
        (r"the key's data is not a valid (?P<type>\S+) key", _("the key's data is not a valid %(type)s key")),
        (
            r"RSA keys need at least (?P<n>\d+) bits; this one has (?P<bits>\d+)",
            _("RSA keys need at least %(n)s bits; this one has %(bits)s"),
        ),
        (
            r"RSA keys have at most (?P<n>\d+) bits; this one has (?P<bits>\d+)",
            _("RSA keys have at most %(n)s bits; this one has %(bits)s"),
        ),
        (r"you already added this key, as (?P<name>.*)", _("you already added this key, as %(name)s")),
        # a job's mounts (caldera/core/spec.py)
        (
            r"Value error, must be one of (?P<tops>/.*) or lie below one",
            _("must be one of %(tops)s or lie below one"),
        ),
        (
            r"Value error, two mounts at the same path, or one inside another",
            _("two mounts at the same path, or one inside another"),
        ),
        (
            r"Value error, a mount names one of space, dataset or model",
            _("a mount names one of space, dataset or model"),
        ),
        (r"Value error, a dataset or model is mounted read-only", _("a dataset or model is mounted read-only")),
        (r"no dataset (?P<ref>\S+) that you may read", _("no dataset %(ref)s that you may read")),
        (r"no model (?P<ref>\S+) that you may read", _("no model %(ref)s that you may read")),
        (
            r"you have (?P<n>\d+) SSH keys, the most one may keep; delete some first",
            _("you have %(n)s SSH keys, the most one may keep; delete some first"),
        ),
    )
)

# pending codes whose English message is the cluster's own text, shown as a value inside a translated sentence
_QUOTES_MESSAGE = {"KueueInsufficientQuota", "KueuePending", "KueueEvicted", "KueueInactive", "Unschedulable"}
_LIST_MAX = 5  # names shown of a list detail (victims, nodes); the rest counted


class Say:
    """The renderings for one page's language; templates get one as ``say``."""

    def __init__(self, gettext: Gettext):
        self._ = gettext

    # ---- labels: the values stay English in forms and URLs
    def state(self, value: str) -> str:
        return self._label(STATES, value)

    def kind(self, value: str) -> str:
        return self._label(KINDS, value)

    def priority(self, value: str) -> str:
        return self._label(PRIORITIES, value)

    def _label(self, table: dict[str, str], value: str) -> str:
        return self._(table[value]) if value in table else value

    # ---- reasons and events
    def pending(self, reason: Mapping[str, Any]) -> str:
        """A stored pending reason ({code, message, details})."""
        english = reason.get("message") or ""
        details = reason.get("details")
        if isinstance(details, Mapping) and reason.get("code") in _QUOTES_MESSAGE:
            details = {**details, "message": english}  # another system's own words, quoted as they came
        return self._coded(PENDING, reason.get("code"), details, english)

    def event(self, event: Any) -> str:
        """A job event (JobEventRow): its code with its details, else its stored message."""
        return self._coded(EVENTS, event.reason, event.details, event.message)

    def advice(self, advice: Mapping[str, Any]) -> str:
        """One piece of right-sizing advice ({code, params})."""
        return self._coded(ADVICE, advice.get("code"), advice.get("params"), str(advice.get("code", "")))

    def job_message(self, job: Any, event: Any | None) -> str:
        """A job's last message, through the event that set it (``jobs.current_events``) when there is one."""
        return self.event(event) if event is not None else job.message

    def _coded(self, table: dict[str, Message], code: Any, details: Any, english: str) -> str:
        message = table.get(code) if isinstance(code, str) else None
        if message is None or not isinstance(details, Mapping):
            return english
        try:
            return message.render(self._values(details), self._) or english
        except (KeyError, TypeError, ValueError):  # a translation with a broken placeholder: never a failed page
            return english

    def _values(self, details: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: self._value(k, v) for k, v in details.items()}
        if "cause" in details:  # a preemption's cause is itself an event code with the same details
            cause = EVENTS.get(str(details["cause"]))
            out["cause"] = cause.render(out, self._) if cause else None
        return out

    def _value(self, key: str, v: Any) -> Any:
        if key in ("estimated_start", "reserved_start") and isinstance(v, int | float):
            return hhmm(v)
        if key == "deadline" and isinstance(v, str):
            try:
                return datetime.fromisoformat(v).astimezone().strftime("%H:%M:%S")
            except ValueError:
                return v
        if key == "gpu_model":
            return v or self._("any model")
        if key == "cap":
            return self._label(USER_CAPS, v)
        if key == "kind":
            return self._label(KINDS, v)
        if key == "state":
            return self._label(STATES, v)
        if key == "tolerance" and isinstance(v, int | float):
            return f"{num(round(v * 100, 1))}%"
        if isinstance(v, list):
            shown = ", ".join(str(x) for x in v[:_LIST_MAX])
            return shown + (self._(" and %(n)s more") % {"n": len(v) - _LIST_MAX} if len(v) > _LIST_MAX else "")
        if isinstance(v, float):
            return num(v)
        return v

    # ---- the API's field errors
    def reason(self, row: Mapping[str, Any]) -> str:
        """One {field, reason[, code, params]} row's reason."""
        text = str(row.get("reason", ""))
        coded = ERRORS.get(row.get("code") or "")
        if coded is not None and isinstance(row.get("params"), Mapping):
            rendered = coded.render(self._values(row["params"]), self._)
            if rendered is not None:
                return rendered
        return self.english_reason(text)

    def english_reason(self, text: str) -> str:
        """A reason that came without a code, by its shape."""
        for pattern, msgid in SHAPES:
            m = pattern.match(text)
            if m:
                values = {k: self._value(k, v) for k, v in m.groupdict().items()}
                return self._(msgid) % values if values else self._(msgid)
        return text

    def errors(self, errors: Any) -> Any:
        """Errors as the pages hold them: a list of {field, reason} rows, or rows by form field name."""
        if isinstance(errors, dict):
            return {k: [self._row(r) for r in v] for k, v in errors.items()}
        if isinstance(errors, list):
            return [{**e, "reason": self.reason(e)} if isinstance(e, dict) else e for e in errors]
        return errors

    def _row(self, r: Any) -> Any:
        if isinstance(r, dict):  # "at": where in a file the field is (an imported job YAML)
            return f"{r['at']}: {self.reason(r)}" if r.get("at") else self.reason(r)
        return self.english_reason(r) if isinstance(r, str) else r
