"""The step journal: what a workflow's named steps returned, kept per Run so that a hop
that runs again replays them instead of executing them.

``tenure_run_steps`` (schema step ``runs_v5``) holds one row per Run and step name: the
step's JSON result, the sequence of the hop that recorded it and when. A record is one
transaction that locks the Run row first (the ledger's lock order) and writes only while
the Run is RUNNING or AWAITING_HARDWARE at the recording hop's sequence, so a hop that
lost its Run (cancelled, failed or retried by recovery, taken over) never records; the
first record of a name wins and is what every later hop replays. Like a checkpoint, a
step row is evidence the Run machine's callers write under the Run's lock, not a state
machine of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tenure.kernel.core import Condition, Finder, Param
from tenure.kernel.runs import finders
from tenure.kernel.runs.record import hop_holds
from tenure.model import ConfigValidationError, ErrorCode, RunRecord, TenureError, canonical_json, load_json
from tenure.model.runs import MAX_RUN_DOCUMENT_BYTES, check_document, check_run_id, check_seq, check_text

from ..core.facade import Transactions
from ..core.store import Transaction
from .table import MAX_STEP_NAME_CHARS, RUNS_BINDING, STEPS_BINDING, STEPS_TABLE, StepRow

__all__ = ["Steps", "STEPS_TABLE", "STEPS_BINDING", "MAX_STEP_NAME_CHARS"]



_OF_RUN = Finder("steps_of_run", ((Condition("run_id", "=", Param("run_id")),),), order=("name",), lock="none")


def _step_id(run_id: str, name: str) -> str:
    return f"{run_id}:{name}"


def _value(row: StepRow) -> Any:
    try:
        return load_json(row.result_json)
    except ValueError:  # JsonProblem: written outside tenure
        raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "corrupt_row") from None


class Steps:
    """The step journal of one Run ledger's database (``RunLedger.steps``), on the
    ledger's transactions; ``get`` reads a Run as the ledger shows it (``RunLedger.get``)."""

    def __init__(self, transactions: Transactions, get: Callable[[str], Awaitable[RunRecord | None]]) -> None:
        self._tx = transactions
        self._get = get

    async def recorded(self, run_id: str) -> dict[str, Any]:
        """Every step the Run recorded, by name."""
        key = check_run_id(run_id)

        async def body(tx: Transaction) -> list[StepRow]:
            return await tx.find(STEPS_BINDING, _OF_RUN, {"run_id": key})

        rows: list[StepRow] = await self._tx.run(body, write=False)
        return {row.name: _value(row) for row in rows}

    async def record(self, run_id: str, enqueue_seq: int, name: str, result: Any) -> tuple[bool, Any]:
        """Record step ``name``'s result for the hop ``enqueue_seq``: ``(True, value)``
        with the value every hop of the Run replays (an earlier record of the same name
        wins), or ``(False, None)`` when that hop does not hold the Run any more."""
        key = check_run_id(run_id)
        seq = check_seq(enqueue_seq)
        name = check_text(name, "step_name", MAX_STEP_NAME_CHARS)
        text = canonical_json(check_document(result, "step_result"))
        if len(text.encode()) > MAX_RUN_DOCUMENT_BYTES:
            raise ConfigValidationError("invalid_step", fields=("step_result",), problems=("document_too_large",))

        async def body(tx: Transaction) -> str | None:  # None: the hop does not hold the Run
            runs = await tx.locked(RUNS_BINDING, finders.runs_by_keys, {"keys": [key]})
            if not runs or not hop_holds(runs[0], seq):
                return None
            stored: list[StepRow] = await tx.read(STEPS_BINDING, [_step_id(key, name)])
            if stored:
                return stored[0].result_json
            row = StepRow(_step_id(key, name), key, name, seq, text, await tx.now_us())
            await tx.insert(STEPS_BINDING, row)
            return text

        kept = await self._tx.run(body)
        return (False, None) if kept is None else (True, load_json(kept))

    async def holds(self, run_id: str, enqueue_seq: int) -> bool:
        """Whether the hop ``enqueue_seq`` still holds the Run (read, not locked): checked
        before a step's body runs, so a hop that already lost its Run runs none."""
        run = await self._get(run_id)
        return run is not None and hop_holds(run, enqueue_seq)
