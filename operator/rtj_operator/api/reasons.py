"""Failure classes, categories, phases and condition reasons: names users and alerts match on.

These strings appear in `kubectl get/describe`, in Events, in metrics labels and in
`rtj classify` output, so they are a contract: add names, never rename them.
"""

from __future__ import annotations

from enum import Enum


class FailureClass(str, Enum):
    """Why an attempt's first failed rank failed."""

    NODE_LOST = "NodeLost"
    GPU_FAULT = "GPUFault"
    NETWORK_FAULT = "NetworkFault"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    OUT_OF_MEMORY = "OutOfMemory"
    USER_ERROR = "UserError"
    CONFIG_ERROR = "ConfigError"
    CHECKPOINT_CORRUPT = "CheckpointCorrupt"
    UNKNOWN = "Unknown"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    """The image could not be pulled for a reason the job does not control: the registry
    throttled (429) or failed (5xx, timeouts), or one node's runtime could not pull what
    other nodes pulled. A name that does not exist or may not be read is ConfigError."""
    PODS_READY_TIMEOUT = "PodsReadyTimeout"
    """Kueue evicted the admitted workload because its pods were not all ready within
    `waitForPodsReady.timeout`: the group never started, which is no failure of its code."""
    SILENT_DATA_CORRUPTION = "SilentDataCorruption"
    """The trainer refused to publish a state that showed a symptom of silent data
    corruption (rtj_shim.integrity: replicas that differ bit for bit, a loss or gradient
    norm far outside its recent values) and exited: the newest published step was reached
    before the symptom. Its verdict may name the suspect ranks and their pods
    (`rtj_shim.wire.suspect_verdict`): the first failed is then the suspect pod
    (`firstFailed.suspect`), and the job's later attempts avoid its node. The trainer's
    word taints no node for anyone else (category infrastructure, spends a budget of its
    own, failurePolicy.silentDataCorruptionRestarts; the whole world restarts from the
    newest published step)."""
    PREFLIGHT_FAILED = "PreflightFailed"
    """A pod of a new world failed the platform's preflight before the job's state was
    loaded (`rtj-shim preflight` in the ``rtj-preflight`` init container, the platform's
    image and command): its node-local check failed, or its link was slower than the
    world's median by the job's factor both ways. A failed node check quarantines its node
    and the attempt is replaced without spending maxRestarts while a new node is quarantined
    each time (the quarantine limit bounds it); a slow link (measured with the job's own
    pods, which the tenant can slow) taints nothing: the job's next attempt avoids the node
    and the restart spends maxRestarts."""
    HANG = "Hang"
    """Every pod Running, but the rank furthest behind has made no progress in its section
    for longer than the job's hang timeout (from the ranks' progress reports). A wedged GPU,
    a dead NIC and a deadlock in the job's code look alike from outside: the category is
    `unknown` (spends maxRestarts with backoff, quarantines nothing)."""

    @property
    def category(self) -> FailureCategory:
        return _CATEGORY[self]


class FailureCategory(str, Enum):
    """Which budget a failure spends, and whether a node may be blamed for it."""

    INFRASTRUCTURE = "infrastructure"
    PREEMPTION = "preemption"
    USER = "user"
    CHECKPOINT = "checkpoint"
    UNKNOWN = "unknown"

    @property
    def retryable(self) -> bool:
        """User errors are deterministic: retrying them burns GPUs (unless budgeted)."""
        return self is not FailureCategory.USER


_CATEGORY = {
    FailureClass.NODE_LOST: FailureCategory.INFRASTRUCTURE,
    FailureClass.GPU_FAULT: FailureCategory.INFRASTRUCTURE,
    FailureClass.NETWORK_FAULT: FailureCategory.INFRASTRUCTURE,
    FailureClass.EVICTED: FailureCategory.INFRASTRUCTURE,
    FailureClass.PREEMPTED: FailureCategory.PREEMPTION,
    FailureClass.OUT_OF_MEMORY: FailureCategory.USER,
    FailureClass.USER_ERROR: FailureCategory.USER,
    FailureClass.CONFIG_ERROR: FailureCategory.USER,
    FailureClass.CHECKPOINT_CORRUPT: FailureCategory.CHECKPOINT,
    FailureClass.UNKNOWN: FailureCategory.UNKNOWN,
    FailureClass.IMAGE_PULL_FAILED: FailureCategory.INFRASTRUCTURE,
    FailureClass.PODS_READY_TIMEOUT: FailureCategory.INFRASTRUCTURE,
    FailureClass.HANG: FailureCategory.UNKNOWN,
    FailureClass.SILENT_DATA_CORRUPTION: FailureCategory.INFRASTRUCTURE,
    FailureClass.PREFLIGHT_FAILED: FailureCategory.INFRASTRUCTURE,
}


class Phase(str, Enum):
    PENDING = "Pending"
    ADMITTED = "Admitted"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    """spec.suspend is true: no attempt runs (a running one was stopped, no budget spent);
    the condition Suspended says the same for `kubectl wait`."""

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class InPlaceStage(str, Enum):
    """status.inPlace.phase: the stage of an in-place restart in progress."""

    STOPPING = "Stopping"
    """Every pod is ordered to stop the old generation (the barrier: all report stopped)."""
    STARTING = "Starting"
    """The step is pinned; every pod is ordered to start the new generation from it."""


class RecoveryPhase(str, Enum):
    """status.recoveryPhase: where the job stands in the recovery state machine
    (`rtj_operator.recovery`: derived from the status, checked against its transition table
    on every plan). `Phase` is the coarse lifecycle word for `kubectl get`; this one says
    which recovery step holds the job."""

    NOT_STARTED = "NotStarted"
    """No attempt yet: the first one is due."""
    RUNNING = "Running"
    """An attempt's world is pending, admitted or running, and nothing is being recovered."""
    STOPPING_IN_PLACE = "StoppingInPlace"
    """An in-place restart: the trainers of the old generation are being stopped."""
    STARTING_IN_PLACE = "StartingInPlace"
    """An in-place restart: the trainers of the new generation are being started."""
    BACKING_OFF = "BackingOff"
    """The failed attempt's world is torn down while the backoff runs."""
    STARTING = "Starting"
    """The next attempt is due: it starts once the old world is gone and the store is read."""
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in (RecoveryPhase.SUCCEEDED, RecoveryPhase.FAILED)


class ConditionType(str, Enum):
    """status.conditions[].type (metav1.Condition style)."""

    ADMITTED = "Admitted"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    COMPLETE = "Complete"
    """True once the job succeeded: the condition `kubectl wait --for=condition=Complete`
    matches on a Job, a JobSet and a TrainJob alike."""
    SUCCEEDED = "Succeeded"
    """Set with Complete, for clients of this API before it: deprecated, removed with
    v1alpha1 (wait for Complete)."""
    FAILED = "Failed"
    NODES_QUARANTINED = "NodesQuarantined"
    CHECKPOINT_STALE = "CheckpointStale"
    CHECKPOINT_UNREADABLE = "CheckpointUnreadable"
    NODES_UNREACHABLE = "NodesUnreachable"
    """True while most nodes have stopped renewing their Leases at once (a partition): the
    operator holds (no restart, no taint) until contact returns."""
    STALLED = "Stalled"
    """True while an admitted attempt does not get all its workers running (its reason
    says why: PodsUnschedulable, PodsNotCreated; pods of an earlier attempt that stay
    Terminating are Restarting's reason PodsStuckTerminating)."""
    STRAGGLING = "Straggling"
    """True while a rank's busy time per step stays above the others' median / ratio for
    spec.progress.stragglers.windows consecutive windows (the message names the ranks)."""
    SUSPENDED = "Suspended"
    """True while spec.suspend holds the job (reason JobSuspended); False once resumed
    (JobResumed), as on a batch Job."""
    ELASTIC = "Elastic"
    """spec.elastic: True while the job trains on fewer pods than spec.replicas (reason
    Shrunk, the message says which ranks and why); False once it grew back (GrowingBack)."""


class Reason(str, Enum):
    """Condition and Event reasons for the operator's decisions (beside FailureClass names)."""

    ATTEMPT_STARTED = "AttemptStarted"
    BACKOFF = "BackoffWaiting"
    RESTART_SCHEDULED = "RestartScheduled"
    NODES_QUARANTINED = "NodesQuarantined"
    CHECKPOINT_MARKED_BAD = "CheckpointMarkedBad"
    PREFLIGHT_NODE_REPLACED = "PreflightNodeReplaced"
    RESTART_BUDGET_EXHAUSTED = "RestartBudgetExhausted"
    USER_ERROR_BUDGET_EXHAUSTED = "UserErrorBudgetExhausted"
    SDC_BUDGET_EXHAUSTED = "SilentDataCorruptionBudgetExhausted"
    UNKNOWN_FAILURE_FLAGGED = "UnknownFailureFlagged"
    TERMINAL = "Terminal"
    NO_FAILURE = "NoFailure"
    AWAITING_ADMISSION = "AwaitingAdmission"
    ATTEMPT_ADMITTED = "AttemptAdmitted"
    ATTEMPT_RUNNING = "AttemptRunning"
    JOB_SUCCEEDED = "JobSucceeded"
    WAITING_FOR_OLD_WORLD = "WaitingForOldWorld"
    CHECKPOINT_STORE_UNREADABLE = "CheckpointStoreUnreadable"
    CHECKPOINT_READABLE = "CheckpointStoreReadable"
    QUARANTINE_LIFTED = "QuarantineLifted"
    LOCAL_QUEUE_NOT_FOUND = "LocalQueueNotFound"
    """Admitted=False (and a Warning Event) while spec.queueName names no LocalQueue."""
    PODS_UNSCHEDULABLE = "PodsUnschedulable"
    PODS_NOT_CREATED = "PodsNotCreated"
    PODS_STUCK_TERMINATING = "PodsStuckTerminating"
    PROGRESSING = "Progressing"
    NODES_UNREACHABLE = "NodesUnreachable"
    CONTACT_RESTORED = "ContactRestored"
    JOBSET_REJECTED = "JobSetRejected"
    """Admitted=False (and a Warning Event): the API server or an admission webhook refused
    the rendered JobSet; the job waits for its spec to change."""
    STRAGGLER_DETECTED = "StragglerDetected"
    """Straggling=True (and a Warning Event per change): ranks slower than the others."""
    NO_STRAGGLERS = "NoStragglers"
    RESUME_MISALIGNED = "ResumeMisaligned"
    """Warning Event: the trainers' data alignment check after a resume named ranks whose
    losses left the ranks' spread before the fault (status.progress.misalignedResume)."""
    JOB_SUSPENDED = "JobSuspended"
    """Suspended=True: spec.suspend stopped the job (a batch Job's condition reason)."""
    JOB_RESUMED = "JobResumed"
    """Suspended=False: spec.suspend was cleared; the next attempt follows at once."""
    SUSPENDED = "Suspended"
    """The Event of a suspension (a batch Job's Event reason)."""
    RESUMED = "Resumed"
    """The Event of a resume (a batch Job's Event reason)."""
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    """Failed=True: the job was active longer than spec.activeDeadlineSeconds (a batch Job's
    failure reason); category user."""
    TTL_EXPIRED = "TTLExpired"
    """The Event of the deletion after spec.ttlSecondsAfterFinished."""
    RESTARTING_IN_PLACE = "RestartingInPlace"
    """Event: a failure is being restarted inside the attempt's pods (spec.recovery.inPlace)."""
    RESTARTED_IN_PLACE = "RestartedInPlace"
    """Event: every pod runs the new generation of the trainers."""
    IN_PLACE_FELL_BACK = "InPlaceRestartFellBack"
    """Event: the in-place restart missed its deadline; the whole world is re-created."""
    SHRUNK = "Shrunk"
    """Warning Event (spec.elastic): a replaced pod's replacement did not come within
    waitForReplacementSeconds; the other pods restart as a smaller world."""
    GROWING_BACK = "GrowingBack"
    """Event (spec.elastic): pods for a shrunk world's missing ranks run again; the trainers
    restart in place as the larger world."""
    DEPRECATED_FIELD = "DeprecatedField"
    """Warning Event, once per spec generation: the job sets a deprecated field (the
    message names it and what replaces it)."""
