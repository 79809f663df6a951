"""CPU and Python function calls per decision: each compiled queue decider
(tenure.kernel.compiled, ``QUEUE`` ``deciders()``) beside the generic
``decide_windowed`` it equals.

    .venv/bin/python -P bench/compiled_deciders.py [ITERATIONS]

For each compiled command, one applying situation (a live claim with its exact fence;
the claim meets a due pending row) is decided ITERATIONS times (default 200,000) by
each path; the best of five ``timeit`` runs gives the CPU per decision. Python function
calls (``sys.setprofile`` ``call`` events; C functions are not counted) are counted over
one decision. Not a test: nothing is asserted; the two paths' answers are checked equal
once before timing.
"""

from __future__ import annotations

import sys
import timeit
from typing import Any

from tenure.kernel.ahead import decide_windowed
from tenure.kernel.queue.commands import (
    ClaimFence,
    ClaimOwned,
    CompleteOwned,
    FailOwned,
    HeartbeatOwned,
    QueueCommandType,
    ReleaseOwned,
)
from tenure.kernel.queue.machine import QUEUE, deciders
from tenure.kernel.queue.record import QueueRow
from tenure.model import JobStatus, QueueKind

NOW = 1_800_000_000_000_000

CLAIMED = QueueRow(
    queue=QueueKind.VALIDATION, job_id="job-1", run_id=None, status=JobStatus.CLAIMED, attempts=1, max_attempts=3,
    generation=1, owner_id="worker-a", claim_token="token-1", claimed_at_us=NOW - 1_000_000,
    lease_expires_at_us=NOW + 30_000_000, fires_at_us=NOW - 2_000_000, created_at_us=NOW - 2_000_000,
    completed_at_us=None, cancel_requested=False, pid=None, fence_required=True, submission_id="sub-1",
    fingerprint="v1:aaaa", idempotency_key=None, active_key=None, dlq_record_id=None, error_message=None,
    result_json=None, payload=("{}",),
)
PENDING = QueueRow(**{**{name: getattr(CLAIMED, name) for name in CLAIMED.__dataclass_fields__},
                      "status": JobStatus.PENDING, "attempts": 0, "generation": 0, "owner_id": None,
                      "claim_token": None, "claimed_at_us": None, "lease_expires_at_us": None})
FENCE = ClaimFence(queue=QueueKind.VALIDATION, job_id="job-1", owner_id="worker-a", generation=1, claim_token="token-1")

SITUATIONS: dict[QueueCommandType, tuple[Any, Any]] = {
    QueueCommandType.HEARTBEAT_OWNED: (CLAIMED, HeartbeatOwned(fence=FENCE, lease_us=30_000_000)),
    QueueCommandType.COMPLETE_OWNED: (CLAIMED, CompleteOwned(fence=FENCE, result_json='{"ok":1}')),
    QueueCommandType.FAIL_OWNED: (CLAIMED, FailOwned(fence=FENCE, error_message="boom", retry=True, dlq_record_id=None,
                                                     backoff_base_ms=100, backoff_max_ms=1000)),
    QueueCommandType.RELEASE_OWNED: (CLAIMED, ReleaseOwned(fence=FENCE)),
    QueueCommandType.CLAIM_OWNED: (PENDING, ClaimOwned(owner_id="worker-b", claim_token="token-2",
                                                       nonce_already_stored=False, lease_us=30_000_000)),
}


def calls_of(function: Any, *arguments: Any) -> int:
    """Python function calls one call of ``function`` makes, itself included."""
    seen = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen[0] += 1

    sys.setprofile(profile)
    try:
        function(*arguments)
    finally:
        sys.setprofile(None)
    return seen[0]


def main(iterations: int) -> None:
    print(f"{'command':<18} {'generic us':>10} {'compiled us':>11} {'ratio':>6} {'generic calls':>13} {'compiled calls':>14}")
    for kind, (record, command) in SITUATIONS.items():
        compiled = deciders()[kind]
        generic = decide_windowed(QUEUE, record, command, NOW)
        assert generic is not None and generic == compiled(record, command, NOW), kind
        timings = {}
        for label, call in (("generic", lambda: decide_windowed(QUEUE, record, command, NOW)),
                            ("compiled", lambda: compiled(record, command, NOW))):
            timings[label] = min(timeit.repeat(call, number=iterations, repeat=5)) / iterations * 1e6
        generic_calls = calls_of(decide_windowed, QUEUE, record, command, NOW)
        compiled_calls = calls_of(compiled, record, command, NOW)
        print(f"{kind.value:<18} {timings['generic']:>10.2f} {timings['compiled']:>11.2f} "
              f"{timings['compiled'] / timings['generic']:>6.2f} {generic_calls:>13} {compiled_calls:>14}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
