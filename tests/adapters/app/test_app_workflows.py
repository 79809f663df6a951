"""The App's workflows on every database: a three-concept hello world, admission replay by
key that fails closed on changed arguments, waits that return their answers by replay
(each step's body run once across hops), determinism checked against the journal, a
cancel through the handle, and bad input refused with nothing written."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from polling import until

from tenure.adapters import App, ConsentAnswer, JobAnswer, WorkflowContext, WorkflowFailed, upgrade
from tenure.adapters.runs.replay import ChildFailed
from tenure.adapters.runs.replay import JOURNAL_PREFIX
from tenure.model import BrokerJobState, ConfigValidationError, ErrorCode, RunStatus, TenureError, WaitKind, hop_key

HANG_GUARD_S = 120.0
"""Only stops a hang: every wait below ends as soon as its condition holds."""


async def parked_on(app: App, run_id: str, kind: WaitKind) -> str:
    """The owner a Run parks on, once it parks on one of ``kind``."""
    async def parked() -> bool:
        run = await app.ledger.get(run_id)
        return run is not None and run.owner_kind is kind and run.status.value.startswith("awaiting")

    await until(parked, HANG_GUARD_S, what="the Run parks")
    run = await app.ledger.get(run_id)
    assert run is not None and run.owner_id is not None
    return run.owner_id


async def test_the_hello_world_workflow_runs_and_a_replayed_start_answers_the_same_run(db_url: str) -> None:
    app = App(db_url)

    @app.workflow(name="greet")
    async def greet(ctx: WorkflowContext, name: str) -> dict[str, str]:
        title = await ctx.step(str.title, name)
        return {"greeting": f"hello, {title}"}

    async with app.launch(migrate=False):
        handle = await greet.start("ada", key="greet-ada")
        assert await handle.result(wait_s=HANG_GUARD_S) == {"greeting": "hello, Ada"}
        again = await greet.start(name="ada", key="greet-ada")  # the same arguments, by keyword
        assert again.run_id == handle.run_id == App.key_run_id("greet-ada")
        with pytest.raises(TenureError) as changed:
            await greet.start("grace", key="greet-ada")
        assert changed.value.code is ErrorCode.RUN_ADMISSION_CONFLICT
        assert "grace" not in str(changed.value)
        run = await handle.status()
        assert run is not None and run.status is RunStatus.DONE and run.workflow.name == greet.name
        assert run.payload == {"name": "ada"} and run.principal == "app"
        assert len((await app.ledger.list_runs()).items) == 1  # the refused start wrote nothing
    await app.close()


async def test_waits_return_their_answers_and_each_step_runs_once_across_hops(db_url: str) -> None:
    app = App(db_url)
    bodies: list[str] = []

    def count(what: str) -> str:
        bodies.append(what)
        return what.upper()

    @app.workflow(name="refund")
    async def refund(ctx: WorkflowContext, order: str) -> dict[str, Any]:
        first = await ctx.step(count, order)
        verdict = await ctx.consent("refund_order", {"order": order})
        await ctx.sleep(0.05)
        job = await ctx.delegate("agent", "refunds", {"order": order})
        second = await ctx.step(count, "after")
        return {"first": first, "granted": verdict.granted, "decided_by": verdict.decided_by,
                "job": [job.status, job.result["amount"]], "second": second, "resumed": ctx.resumed}

    async with app.launch(migrate=False):
        handle = await refund.start("o-1")
        consent_id = await parked_on(app, handle.run_id, WaitKind.CONSENT)
        assert await app.decide_consent(consent_id, granted=True, decided_by="alice")
        assert not await app.decide_consent(consent_id, granted=False, decided_by="bob")  # the first verdict wins
        job_id = await parked_on(app, handle.run_id, WaitKind.DELEGATE)
        assert await app.ledger.jobs.adopt_result(job_id, {"job_id": job_id, "status": "succeeded",
                                                           "amount": 12})
        result = await handle.result(wait_s=HANG_GUARD_S)  # the relays resume the Run from the adopted job
    assert result == {"first": "O-1", "granted": True, "decided_by": "alice", "job": ["succeeded", 12],
                      "second": "AFTER", "resumed": True}
    assert bodies == ["o-1", "after"]  # four hops ran the workflow; each step's body ran once
    journal = await app.ledger.steps.recorded(handle.run_id)
    counted = f"step:{count.__qualname__}"
    assert [journal[f"{JOURNAL_PREFIX}{p}"]["call"] for p in range(5)] == [
        counted, "consent:refund_order", "sleep", "delegate:agent/refunds", counted]
    await app.close()


async def test_a_changed_body_under_the_same_version_fails_the_run_naming_the_position_and_both_calls(
        db_url: str) -> None:
    before = App(db_url)

    @before.workflow(name="ship", version="3")
    async def ship(ctx: WorkflowContext, order: str) -> dict[str, Any]:
        await ctx.step(str.upper, order, name="reserve")
        verdict = await ctx.consent("ship_order")
        return {"granted": verdict.granted}

    async with before.launch(migrate=False):
        handle = await ship.start("o-2", key="ship-o-2")
        consent_id = await parked_on(before, handle.run_id, WaitKind.CONSENT)
    await before.close()

    after = App(db_url)  # the next deploy: the same name and version, another first call

    @after.workflow(name="ship", version="3")
    async def ship_changed(ctx: WorkflowContext, order: str) -> dict[str, Any]:
        await ctx.step(str.lower, order, name="weigh")
        verdict = await ctx.consent("ship_order")
        return {"granted": verdict.granted}

    async with after.launch(migrate=False):
        assert await after.decide_consent(consent_id, granted=True, decided_by="alice")
        with pytest.raises(WorkflowFailed) as failed:
            await after.handle(handle.run_id).result(wait_s=HANG_GUARD_S)
    assert failed.value.status is RunStatus.FAILED
    assert failed.value.error == ("workflow_diverged: at position 0 the journal holds step:reserve, "
                                  "the workflow asked for step:weigh")
    await after.close()


async def test_a_worker_never_takes_a_run_of_a_version_it_does_not_serve_and_nothing_is_spent(db_url: str) -> None:
    """A rolling deploy: a Run admitted with version 2 while only version 1 is served is
    never claimed by the old worker (its hop waits in version 2's task queue, untouched,
    while the old worker runs a Run of its own published after it), and the first worker
    that serves version 2 runs it, beside the old one."""
    old, new = App(db_url), App(db_url)

    @old.workflow(name="bill", version="1")
    async def bill_v1(ctx: WorkflowContext, order: str) -> dict[str, Any]:
        raise AssertionError("a version 1 worker must not run a version 2 Run")

    @old.workflow(name="ping", version="1")
    async def ping(ctx: WorkflowContext) -> dict[str, str]:
        return {"ping": "pong"}

    @new.workflow(name="bill", version="2")
    async def bill_v2(ctx: WorkflowContext, order: str) -> dict[str, Any]:
        return {"version": 2, "order": await ctx.step(str.upper, order)}

    async with old.launch(migrate=False, node="deploy-old") as serving_old:
        assert serving_old.runs is not None
        handle = await bill_v2.start("o-9", key="bill-o-9")
        queued = await handle.status()
        # The old worker's claims take a Run published after the version 2 Run (so due
        # later): were the version 2 hop claimable to it, it would have come first.
        assert await (await ping.start()).result(wait_s=HANG_GUARD_S) == {"ping": "pong"}
        assert (serving_old.runs.outcomes["unserved"], serving_old.runs.outcomes["done"]) == (0, 1)
        # Not claimed, not failed, no hop spent. (Only ``updated_at`` may move: where the
        # start's publish met a busy SQLite file, a relay records the publication.)
        assert dataclasses.replace(await handle.status(), updated_at=queued.updated_at) == queued  # type: ignore[type-var]
        assert queued is not None and queued.status is RunStatus.QUEUED and queued.enqueue_seq == 0
        assert (await old.broker.probe(hop_key(handle.run_id, 0))).state is BrokerJobState.QUEUED
        async with new.launch(migrate=False, node="deploy-new") as serving_new:
            assert await handle.result(wait_s=HANG_GUARD_S) == {"version": 2, "order": "O-9"}
            assert serving_new.runs is not None and serving_new.runs.outcomes["done"] == 1
        run = await handle.status()
        assert run is not None and run.workflow.revision == "2" and run.error is None
        assert (serving_old.runs.outcomes["unserved"], serving_old.runs.outcomes["done"],
                serving_old.runs.outcomes["failed"]) == (0, 1, 0)
    await old.close()
    await new.close()


async def test_a_replay_that_skips_a_call_before_the_wait_it_resumes_from_diverges(db_url: str) -> None:
    before = App(db_url)

    @before.workflow(name="audit")
    async def audit(ctx: WorkflowContext) -> None:
        await ctx.step(int, "1", name="one")
        await ctx.step(int, "2", name="two")
        await ctx.consent("publish")

    async with before.launch(migrate=False):
        handle = await audit.start()
        consent_id = await parked_on(before, handle.run_id, WaitKind.CONSENT)
    await before.close()
    # The journal loses position 1 (as if the body had changed order): the resumed hop
    # reaches the consent at position 1, while the Run waited at position 2.
    after = App(db_url)

    @after.workflow(name="audit")
    async def audit_shorter(ctx: WorkflowContext) -> None:
        await ctx.step(int, "1", name="one")
        await ctx.consent("publish")

    async with after.launch(migrate=False):
        assert await after.decide_consent(consent_id, granted=True, decided_by="alice")
        with pytest.raises(WorkflowFailed) as failed:
            await after.handle(handle.run_id).result(wait_s=HANG_GUARD_S)
    assert failed.value.error == ("workflow_diverged: at position 1 the journal holds step:two, "
                                  "the workflow asked for consent:publish")
    await after.close()


async def test_cancelling_a_waiting_run_through_its_handle_ends_it_cancelled(db_url: str) -> None:
    app = App(db_url)

    @app.workflow(name="wait_forever")
    async def wait_forever(ctx: WorkflowContext) -> None:
        answer: ConsentAnswer = await ctx.consent("never")
        raise AssertionError(f"resumed with {answer}")

    async with app.launch(migrate=False):
        handle = await wait_forever.start()
        consent_id = await parked_on(app, handle.run_id, WaitKind.CONSENT)
        assert await handle.cancel()
        with pytest.raises(WorkflowFailed) as cancelled:
            await handle.result(wait_s=HANG_GUARD_S)
        assert cancelled.value.status is RunStatus.CANCELLED
        consent = await app.ledger.consents.get(consent_id)
        assert consent is not None and consent.status.value == "cancelled"  # swept with the Run
        assert not await handle.cancel() or (await handle.status()).status is RunStatus.CANCELLED  # type: ignore[union-attr]
    await app.close()


async def test_bad_workflows_and_bad_arguments_are_refused_with_nothing_written(db_url: str) -> None:
    app = App(db_url)

    @app.workflow(name="pay")
    async def pay(ctx: WorkflowContext, amount: int, note: str = "") -> None:
        return None

    with pytest.raises(ConfigValidationError) as unbound:
        await pay.start(amount=1, currency="EUR")
    assert unbound.value.reason == "invalid_workflow_arguments"
    with pytest.raises(ConfigValidationError):
        await pay.start(amount=object())  # not JSON
    with pytest.raises(ConfigValidationError):
        await pay.start(amount=1, key="")  # an empty key
    with pytest.raises(ConfigValidationError) as oversized:
        await pay.start(amount=1, note="x" * (2 * 1024 * 1024))
    assert oversized.value.problems == ("payload_too_large",) and "xxx" not in str(oversized.value)
    with pytest.raises(ConfigValidationError) as sync:
        app.workflow(name="sync")(lambda ctx: None)
    assert sync.value.problems == ("async_function_required",)

    async def reserved(ctx: WorkflowContext, key: str) -> None:
        return None

    with pytest.raises(ConfigValidationError) as clash:
        app.workflow(name="reserved")(reserved)
    assert clash.value.problems == ("reserved_argument_name",)
    with pytest.raises(ConfigValidationError):
        app.workflow(name="pay")(reserved)  # the name is taken
    with pytest.raises(ConfigValidationError):
        app.get_workflow("nope")
    assert (await app.ledger.list_runs()).items == ()
    await app.close()


async def test_launch_migrates_a_fresh_database_first(fresh_db_url: str) -> None:
    app = App(fresh_db_url)

    @app.workflow(name="noop")
    async def noop(ctx: WorkflowContext) -> dict[str, int]:
        return {"answer": await ctx.step(len, "four")}

    async with app.launch():
        assert await (await noop.start()).result(wait_s=HANG_GUARD_S) == {"answer": 4}
    await app.close()
    await upgrade(fresh_db_url)  # migrating again is a no-op


def test_the_answers_a_workflow_gets_are_plain_values() -> None:
    assert ConsentAnswer("granted", "alice").granted and not ConsentAnswer("expired", "tenure:deadline").granted
    assert JobAnswer("succeeded", {"x": 1}).ok and not JobAnswer("lost", None).ok



def family(app: App, child_calls: list[str]) -> dict[str, Any]:
    @app.workflow(name="pack")
    async def pack(ctx: WorkflowContext, item: str) -> dict[str, Any]:
        child_calls.append(item)
        if item == "broken":
            raise ValueError("cannot pack")
        if item == "slow":
            await ctx.consent("pack_slowly")
        return {"packed": item.upper()}

    @app.workflow(name="order")
    async def order(ctx: WorkflowContext, items: list[str]) -> dict[str, Any]:
        children = [await ctx.start_child(pack, item) for item in items]
        await ctx.sleep(0.01)  # one more hop: the children are not started again
        packed: list[Any] = []
        for child in children:
            try:
                packed.append(await child.result())
            except ChildFailed as failed:
                packed.append({"failed": failed.status, "error": failed.error})
        return {"packed": packed, "children": [child.run_id for child in children]}

    return {"pack": pack, "order": order}


async def test_a_parent_waits_for_its_children_and_gets_their_results_or_their_failures(db_url: str) -> None:
    app = App(db_url)
    child_calls: list[str] = []
    flows = family(app, child_calls)
    async with app.launch(migrate=False):
        handle = await flows["order"].start(["a", "broken"])
        result = await handle.result(wait_s=HANG_GUARD_S)
    assert result["packed"] == [{"packed": "A"}, {"failed": "failed",
                                                  "error": "workflow_error:ValueError: cannot pack"}]
    assert sorted(child_calls) == ["a", "broken"]  # each child ran once, however many hops the parent made
    runs = (await app.ledger.list_runs()).items
    assert len(runs) == 3
    for child_id in result["children"]:
        child = await app.ledger.get(child_id)
        assert child is not None and child.principal == "app"
    journal = await app.ledger.steps.recorded(handle.run_id)
    jobs = [await app.ledger.jobs.get(entry["answer"]["job_id"]) for entry in journal.values()
            if entry["call"] == "child:pack"]
    assert [job.status.value for job in jobs if job is not None] == ["succeeded", "failed"]
    assert await app.ledger.jobs.list(handle.run_id) == ()  # none open
    await app.close()


async def test_a_child_start_that_meets_database_failures_is_retried_and_starts_one_child(db_url: str) -> None:
    """Admitting the child and recording it on its job are retried through database
    failures like every call of the hop (the Run chaos test found a parent left RUNNING
    when the job's COMMIT went unacknowledged): the admission fails before it applies,
    the job's advance applies and its answer is lost; the parent still ends with one child."""
    app = App(db_url)
    child_calls: list[str] = []
    flows = family(app, child_calls)
    failures = {"admission": 0, "advance": 0}
    start_child_run, advance = app.start_child_run, app.ledger.jobs.advance

    async def admission_refused_once(*args: Any, **kwargs: Any) -> str:
        if not failures["admission"]:
            failures["admission"] += 1
            raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "connection_refused")
        return await start_child_run(*args, **kwargs)

    async def advance_unacknowledged_once(*args: Any, **kwargs: Any) -> bool:
        applied = await advance(*args, **kwargs)
        if not failures["advance"]:
            failures["advance"] += 1
            assert applied
            raise TenureError(ErrorCode.RUN_PERSISTENCE_FAILED, "commit_unacknowledged")
        return applied

    app.start_child_run = admission_refused_once  # type: ignore[method-assign]
    app.ledger.jobs.advance = advance_unacknowledged_once  # type: ignore[method-assign]
    async with app.launch(migrate=False):
        handle = await flows["order"].start(["a"])
        result = await handle.result(wait_s=HANG_GUARD_S)
    assert failures == {"admission": 1, "advance": 1}
    assert result["packed"] == [{"packed": "A"}] and child_calls == ["a"]
    assert len((await app.ledger.list_runs()).items) == 2  # the parent and one child
    await app.close()


async def test_a_parent_that_raises_beside_a_running_child_fails_with_the_child_contained_without_a_restart(
        db_url: str) -> None:
    """A workflow that raises while its child runs cannot settle FAILED at once (the child
    is an open effect: the settle is refused and the hop's outcome recorded, ``unsettled``).
    The live node recovers that ended hop as its next start would: the child is contained
    (cancelled) and the parent settles with its recorded error. Before, the Run stayed
    RUNNING until its node's next start."""
    app = App(db_url)
    flows = family(app, [])

    @app.workflow(name="careless")
    async def careless(ctx: WorkflowContext, item: str) -> None:
        await ctx.start_child(flows["pack"], item)  # the child waits for a consent nobody gives
        raise ValueError("gave up")

    async with app.launch(migrate=False) as worker:
        handle = await careless.start("slow")
        assert worker.runs is not None
        runs = worker.runs
        with pytest.raises(WorkflowFailed) as failed:
            await handle.result(wait_s=HANG_GUARD_S)
        assert failed.value.status is RunStatus.FAILED
        assert runs.outcomes["unsettled"] == 1
        # The runtime forgets the hop just after its transaction settled the Run, which the
        # handle may see first: waited for, never assumed.
        await until(lambda: runs.unsettled == 0, HANG_GUARD_S, what="the settled hop forgotten")
    run = await app.ledger.get(handle.run_id)
    assert run is not None and run.error == "workflow_error:ValueError: gave up"
    journal = await app.ledger.steps.recorded(handle.run_id)
    (entry,) = [entry for entry in journal.values() if entry["call"] == "child:pack"]
    job = await app.ledger.jobs.get(entry["answer"]["job_id"])
    assert job is not None and job.status.value == "cancelled"
    child = await app.ledger.get(entry["answer"]["run_id"])
    assert child is not None and child.status is RunStatus.CANCELLED
    await app.close()


@pytest.mark.parametrize("cut", ["before_the_admission", "after_the_admission"])
async def test_a_child_job_whose_child_was_never_recorded_on_it_is_contained_by_its_admission_key(
        db_url: str, cut: str) -> None:
    """The hop that starts a child ends between the job's submission and recording the
    child on it (here: an error nobody retries; in production a kill or a freeze). The job
    names no child, yet recovery must contain it: the child admitted under the job's key
    is cancelled, or, never admitted, the job is recorded CANCELLED; the parent then
    settles FAILED with its recorded error (the Run chaos test left such a parent RUNNING)."""
    app = App(db_url)
    flows = family(app, [])
    start_child_run, advance = app.start_child_run, app.ledger.jobs.advance

    async def admission(*args: Any, **kwargs: Any) -> str:
        if cut == "before_the_admission":
            raise RuntimeError("the hop ends before the child is admitted")
        return await start_child_run(*args, **kwargs)

    async def never_recorded(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("the hop ends before the child is recorded on its job")

    @app.workflow(name="cut_short")
    async def cut_short(ctx: WorkflowContext, item: str) -> None:
        child = await ctx.start_child(flows["pack"], item)  # the child would wait for a consent
        await child.result()

    app.start_child_run = admission  # type: ignore[method-assign]
    app.ledger.jobs.advance = never_recorded  # type: ignore[method-assign]
    async with app.launch(migrate=False):
        handle = await cut_short.start("slow")
        with pytest.raises(WorkflowFailed) as failed:
            await handle.result(wait_s=HANG_GUARD_S)
        assert failed.value.status is RunStatus.FAILED
    app.ledger.jobs.advance = advance  # type: ignore[method-assign]
    run = await app.ledger.get(handle.run_id)
    assert run is not None and run.error is not None and run.error.startswith("workflow_error:RuntimeError")
    assert await app.ledger.jobs.list(handle.run_id) == ()  # the job is contained: none open
    children = [r for r in (await app.ledger.list_runs()).items if r.run_id != handle.run_id]
    if cut == "before_the_admission":
        assert children == []
    else:
        assert [child.status for child in children] == [RunStatus.CANCELLED]
        assert children[0].run_id == App.key_run_id(f"child:{handle.run_id}@0")
    await app.close()


async def test_cancelling_a_parent_cancels_its_running_child_with_containment_proven(db_url: str) -> None:
    app = App(db_url)
    flows = family(app, [])
    async with app.launch(migrate=False):
        handle = await flows["order"].start(["slow"])
        await parked_on(app, handle.run_id, WaitKind.DELEGATE)  # waiting on its child
        job = (await app.ledger.jobs.list(handle.run_id))[0]
        assert job.runtime_job_id is not None
        consent_id = await parked_on(app, job.runtime_job_id, WaitKind.CONSENT)  # the child waits too
        assert await handle.cancel()
        with pytest.raises(WorkflowFailed) as cancelled:
            await handle.result(wait_s=HANG_GUARD_S)
        assert cancelled.value.status is RunStatus.CANCELLED
        child = await app.ledger.get(job.runtime_job_id)
        assert child is not None and child.status is RunStatus.CANCELLED
        consent = await app.ledger.consents.get(consent_id)
        assert consent is not None and consent.status.value == "cancelled"
        contained = await app.ledger.jobs.get(job.job_id)
        assert contained is not None and contained.status.value == "cancelled"
    await app.close()


async def test_a_hop_that_lost_its_run_runs_no_step_body(db_url: str) -> None:
    app = App(db_url)
    ran: list[str] = []
    cancelled = asyncio.Event()

    @app.workflow(name="slow_start")
    async def slow_start(ctx: WorkflowContext) -> None:
        await cancelled.wait()  # the Run is cancelled while this hop holds it
        await ctx.step(ran.append, "body")

    async with app.launch(migrate=False) as worker:
        handle = await slow_start.start()

        async def running() -> bool:
            run = await handle.status()
            return run is not None and run.status is RunStatus.RUNNING

        await until(running, HANG_GUARD_S, what="the hop runs")
        ticket = await app.ledger.begin_cancel(handle.run_id)  # elected, not finished: the hop still runs
        assert ticket is not None
        cancelled.set()  # the body goes on to its step at once (the worker's watch reads once a second)
        assert worker.runs is not None
        runs = worker.runs
        await until(lambda: runs.outcomes["cancelled"] + runs.outcomes["lost"], HANG_GUARD_S, what="the hop ended")
    assert ran == []  # the hop checked that it still held its Run before the step's body
    await app.close()


async def test_a_workflow_timeout_cancels_the_run_and_its_children_with_reason_timeout(db_url: str) -> None:
    app = App(db_url)
    flows = family(app, [])

    @app.workflow(name="impatient", timeout_s=1)
    async def impatient(ctx: WorkflowContext) -> None:
        child = await ctx.start_child(flows["pack"], "slow")  # the child waits for a consent nobody gives
        await child.result()

    async with app.launch(migrate=False):
        handle = await impatient.start(key="impatient-1")
        with pytest.raises(WorkflowFailed) as timed_out:
            await handle.result(wait_s=HANG_GUARD_S)  # the relays time it out, the children relay contains the child
        assert (timed_out.value.status, timed_out.value.error) == (RunStatus.CANCELLED, "timeout")
        run = await handle.status()
        assert run is not None and run.timed_out and run.deadline is not None
        journal = await app.ledger.steps.recorded(handle.run_id)
        child = await app.ledger.get(journal[f"{JOURNAL_PREFIX}0"]["answer"]["run_id"])
        assert child is not None and child.status is RunStatus.CANCELLED and not child.timed_out
        with pytest.raises(TenureError) as changed:
            await impatient.start(key="impatient-1", timeout_s=5)  # another timeout is other work
        assert changed.value.code is ErrorCode.RUN_ADMISSION_CONFLICT
    with pytest.raises(ConfigValidationError):
        app.workflow(name="never", timeout_s=0)(impatient.function)
    await app.close()


async def test_messages_reach_a_waiting_workflow_once_each_in_order_and_a_timeout_answers_none(db_url: str) -> None:
    app = App(db_url)

    @app.workflow(name="inbox")
    async def inbox(ctx: WorkflowContext) -> dict[str, Any]:
        early = await ctx.recv("orders")  # sent before the workflow asked: taken at once
        first = await ctx.recv("orders")  # parks until the next one is sent
        second = await ctx.recv("orders")
        nothing = await ctx.recv("never", timeout_s=0.5)  # a relay round answers the timeout
        return {"got": [early, first, second], "timed_out": nothing is None}

    async with app.launch(migrate=False):
        handle = await inbox.start(key="inbox-1")
        await app.send(handle.run_id, "orders", {"n": 0}, message_id="m-0")
        await parked_on(app, handle.run_id, WaitKind.MESSAGE)
        sent = await app.send(handle.run_id, "orders", {"n": 1}, message_id="m-1")
        assert await app.send(handle.run_id, "orders", {"n": 1}, message_id="m-1") == sent  # a replay
        with pytest.raises(TenureError) as changed:
            await app.send(handle.run_id, "orders", {"n": 99}, message_id="m-1")
        assert changed.value.code is ErrorCode.RUN_MESSAGE_CONFLICT and "99" not in str(changed.value)
        await app.send(handle.run_id, "other", {"n": -1})  # another topic wakes nobody
        await app.send(handle.run_id, "orders", {"n": 2})
        result = await handle.result(wait_s=HANG_GUARD_S)
        with pytest.raises(TenureError) as finished:
            await app.send(handle.run_id, "orders", {"n": 3})
        assert finished.value.code is ErrorCode.RUN_MESSAGE_REFUSED
    assert result == {"got": [{"n": 0}, {"n": 1}, {"n": 2}], "timed_out": True}
    journal = await app.ledger.steps.recorded(handle.run_id)
    assert [journal[f"{JOURNAL_PREFIX}{p}"]["call"] for p in range(4)] == ["recv:orders"] * 3 + ["recv:never"]
    await app.close()


async def test_an_app_worker_whose_task_worker_fails_ends_with_that_failure_without_waiting_for_stop(
        db_url: str) -> None:
    """``AppWorker.run`` (what ``tenure worker --app`` serves an App with workflows by)
    returns as soon as its task worker fails, raising the failure, instead of serving
    nothing until a signal comes."""
    app = App(db_url)

    @app.task(queue="emails", name="send_welcome")
    async def send_welcome(ctx: Any, user_id: int) -> None:
        return None

    @app.workflow(name="hello")
    async def hello(ctx: WorkflowContext) -> None:
        return None

    worker = app.worker()
    assert worker.tasks is not None

    async def broken(stop: asyncio.Event) -> Any:
        assert worker.tasks is not None
        worker.tasks.hooks_ran.set()  # it started serving (the entry returned) ...
        for _ in range(10):
            await asyncio.sleep(0)
        raise RuntimeError("the task worker broke")  # ... and fails later

    worker.tasks.run = broken  # type: ignore[method-assign]
    serving = asyncio.ensure_future(worker.run(asyncio.Event()))  # stop is never set
    await asyncio.wait([serving], timeout=HANG_GUARD_S)
    if not serving.done():
        serving.cancel()
        await asyncio.wait([serving])
        pytest.fail("the AppWorker kept serving after its task worker failed")
    with pytest.raises(RuntimeError, match="the task worker broke"):
        serving.result()
    await app.close()
