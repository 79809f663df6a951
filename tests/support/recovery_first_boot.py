"""The first boot of the two-boot recovery test: a process that admits Runs, publishes and
claims them, parks some, leaves the rest in every unfinished state, says ``ready`` and
waits to be killed (``kill -9``). Run as ``python recovery_first_boot.py DB_URL SOURCE``;
it prints one JSON line naming its Runs by category before ``ready``."""

from __future__ import annotations

import asyncio
import json
import sys

from table_broker import TableBroker
from tenure.adapters import RunLedger
from tenure.model import RunIntent, WaitKind, WorkflowPin, hop_key

PIN = WorkflowPin("review", "rev-1", "sha256:" + "a" * 64)
NODE = "node-a"
PER_CATEGORY = 3


async def main(db_url: str, source: str) -> None:
    made: dict[str, list[str]] = {}
    async with RunLedger(db_url) as ledger, TableBroker(db_url) as broker:
        serial = 0

        async def admitted(category: str) -> str:
            nonlocal serial
            serial += 1
            intent = RunIntent(session_id=None, source=source, principal="alice", scopes=frozenset({"mail:send"}),
                               payload={"n": serial}, requested_priority=None)
            admission = await ledger.admit(intent, workflow=PIN, queue="agents", priority=50,
                                           idempotency_key=f"{category}-{serial}")
            made.setdefault(category, []).append(admission.run.run_id)
            return admission.run.run_id

        async def claimed(category: str) -> str:
            run_id = await admitted(category)
            assert await ledger.publish(run_id, 0, broker)
            await broker.start(hop_key(run_id, 0))
            assert await ledger.claim(run_id, 0, node=NODE) is not None
            return run_id

        for _ in range(PER_CATEGORY):
            # A hop mid-work when the process dies, with no snapshot: lost.
            await claimed("orphan")
            # A hop that asked for consent and saved its snapshot, killed before parking.
            run_id = await claimed("orphan_checkpointed")
            consent = await ledger.consents.create(run_id, tool_name="mail.send", tool_call_id=f"call-{run_id}",
                                                  payload={"to": "bob"})
            await broker.save_checkpoint(run_id, consent.consent_id)
            # Parked on a consent; the consent is decided while the process is dead.
            run_id = await claimed("parked")
            consent = await ledger.consents.create(run_id, tool_name="mail.send", tool_call_id=f"call-{run_id}",
                                                  payload={"to": "bob"})
            await broker.save_checkpoint(run_id, consent.consent_id)
            assert await ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent.consent_id)
            # Published and waiting at the broker.
            run_id = await admitted("queued")
            assert await ledger.publish(run_id, 0, broker)
            # Admitted; the process died before publishing.
            await admitted("unpublished")
        # Published; then the broker loses it.
        run_id = await admitted("lost_publication")
        assert await ledger.publish(run_id, 0, broker)
        # A broker worker took the job and died before claiming it in the ledger.
        run_id = await admitted("stale_active")
        assert await ledger.publish(run_id, 0, broker)
        await broker.start(hop_key(run_id, 0))
    print(json.dumps(made), flush=True)
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
