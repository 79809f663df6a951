"""The workflow context decides nothing on replay: every call asks the kernel's replay
table (``specs/replay.md``) on the situation the journal and the checkpoint show, and does
what its verdict names; a journal entry the context cannot read keeps its stored error."""

from __future__ import annotations

from typing import Any

import pytest
from polling import until

import tenure.kernel.replay
from tenure.adapters import App, WorkflowContext, WorkflowFailed
from tenure.kernel.replay import Action, Parked, Situation, Verdict
from tenure.model import WaitKind

HANG_GUARD_S = 120.0
"""Only stops a hang: every wait below ends as soon as its condition holds."""


async def _parked_on_consent(app: App, run_id: str) -> str:
    async def parked() -> bool:
        run = await app.ledger.get(run_id)
        return run is not None and run.owner_kind is WaitKind.CONSENT and run.status.value.startswith("awaiting")

    await until(parked, HANG_GUARD_S, what="the Run parks on its consent")
    run = await app.ledger.get(run_id)
    assert run is not None and run.owner_id is not None
    return run.owner_id


async def test_every_replayed_call_is_decided_by_the_kernel_table_on_what_the_journal_and_checkpoint_show(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[Situation, Verdict]] = []
    decide = tenure.kernel.replay.decide

    def recording(situation: Situation) -> Verdict:
        verdict = decide(situation)
        asked.append((situation, verdict))
        return verdict

    monkeypatch.setattr(tenure.kernel.replay, "decide", recording)
    app = App(db_url)

    @app.workflow(name="ship")
    async def ship(ctx: WorkflowContext, order: str) -> dict[str, Any]:
        reserved = await ctx.step(str.upper, order, name="reserve")
        verdict = await ctx.consent("ship_order")
        weighed = await ctx.step(len, order, name="weigh")
        return {"reserved": reserved, "granted": verdict.granted, "weighed": weighed}

    async with app.launch(migrate=False):
        handle = await ship.start("o-1")
        consent_id = await _parked_on_consent(app, handle.run_id)
        first_hop = list(asked)
        assert await app.decide_consent(consent_id, granted=True, decided_by="alice")
        assert await handle.result(wait_s=HANG_GUARD_S) == {"reserved": "O-1", "granted": True, "weighed": 3}
    await app.close()
    parked = Parked(1, "consent:ship_order")
    assert first_hop == [
        (Situation(position=0, asked="step:reserve"), Verdict(Action.RUN, 0, "nothing", "step:reserve")),
        (Situation(position=1, asked="consent:ship_order"), Verdict(Action.RUN, 1, "nothing", "consent:ship_order")),
    ]
    assert asked[len(first_hop):] == [
        (Situation(position=0, asked="step:reserve", recorded="step:reserve", parked=parked),
         Verdict(Action.ANSWER_RECORDED, 0, "step:reserve", "step:reserve")),
        (Situation(position=1, asked="consent:ship_order", parked=parked),
         Verdict(Action.ANSWER_OWNER, 1, "consent:ship_order", "consent:ship_order")),
        (Situation(position=2, asked="step:weigh", parked=parked), Verdict(Action.RUN, 2, "nothing", "step:weigh")),
    ]


@pytest.mark.parametrize(("raw", "shown"), [("junk", "None"), ({"answer": 1}, "None"), ({"call": 5}, "5")],
                         ids=["not-an-object", "no-call", "call-not-a-string"])
async def test_a_journal_entry_the_context_cannot_read_diverges_naming_it_as_it_reads(
        db_url: str, raw: Any, shown: str) -> None:
    app = App(db_url)

    @app.workflow(name="odd")
    async def odd(ctx: WorkflowContext) -> None:
        # Below the replay layer: an entry under position 0's name that is no replay entry.
        await ctx.hop.step("@0", lambda: raw)
        await ctx.step(str.upper, "x", name="upper")

    async with app.launch(migrate=False):
        handle = await odd.start()
        with pytest.raises(WorkflowFailed) as failed:
            await handle.result(wait_s=HANG_GUARD_S)
    assert failed.value.error == (f"workflow_diverged: at position 0 the journal holds {shown}, "
                                  "the workflow asked for step:upper")
    await app.close()
