"""tenure.model: the vocabulary shared by the kernel, the adapters and callers.

Envelopes (strict pydantic), the claim fence, states, bounds, errors and the canonical
submission fingerprint. No I/O happens here.
"""

from __future__ import annotations

from . import bounds
from .attempts import (
    ENVELOPE_TAG,
    TERMINAL_ATTEMPT_STATES,
    UNRESOLVED_STATES,
    AttemptPage,
    AttemptRecord,
    AttemptSpec,
    AttemptState,
    CancelConfirmed,
    CapabilityBinding,
    EgressDecision,
    Found,
    LookupFailed,
    NotFound,
    ProviderFailed,
    ProviderGuarantees,
    ReconcileReport,
    RejectedBeforeEffect,
    ToolBinding,
    Transmission,
)
from .config import WorkerConfig
from .envelopes import (
    DEFAULT_MAX_ATTEMPTS,
    ENVELOPE_FOR_QUEUE,
    ClaimedJob,
    ClaimedPipelineJob,
    ClaimedStreamingJob,
    JobInfo,
    PipelineJob,
    StreamingJob,
    SubmissionEnvelope,
    ValidationJob,
)
from .errors import ConfigValidationError, ErrorCode, TenureError
from .fence import OwnedStreamingState, QueueClaimFence, check_pid
from .fingerprint import (
    FINGERPRINT_VERSION,
    FrozenEnvelope,
    freeze_envelope,
    SubmissionSnapshot,
    check_submission_id,
    envelope_from_authored_json,
    normalize_fires_at,
    snapshot_submission,
    submission_fingerprint,
)
from .json_values import canonical_json, json_problem, text_problem
from .states import TERMINAL_STATUSES, JobStatus, QueueKind
from .validation import datetime_to_micros

__all__ = [
    "bounds",
    "ENVELOPE_TAG",
    "TERMINAL_ATTEMPT_STATES",
    "UNRESOLVED_STATES",
    "AttemptPage",
    "AttemptRecord",
    "AttemptSpec",
    "AttemptState",
    "CancelConfirmed",
    "CapabilityBinding",
    "EgressDecision",
    "Found",
    "LookupFailed",
    "NotFound",
    "ProviderFailed",
    "ProviderGuarantees",
    "ReconcileReport",
    "RejectedBeforeEffect",
    "ToolBinding",
    "Transmission",
    "WorkerConfig",
    "DEFAULT_MAX_ATTEMPTS",
    "ENVELOPE_FOR_QUEUE",
    "ClaimedJob",
    "ClaimedPipelineJob",
    "ClaimedStreamingJob",
    "PipelineJob",
    "StreamingJob",
    "SubmissionEnvelope",
    "ValidationJob",
    "ConfigValidationError",
    "ErrorCode",
    "TenureError",
    "OwnedStreamingState",
    "QueueClaimFence",
    "check_pid",
    "FINGERPRINT_VERSION",
    "FrozenEnvelope",
    "freeze_envelope",
    "JobInfo",
    "SubmissionSnapshot",
    "check_submission_id",
    "envelope_from_authored_json",
    "normalize_fires_at",
    "snapshot_submission",
    "submission_fingerprint",
    "canonical_json",
    "json_problem",
    "text_problem",
    "TERMINAL_STATUSES",
    "JobStatus",
    "QueueKind",
    "datetime_to_micros",
]
