"""The claim fast path keeps its statement per shape by identity (``PostgresStore.
_claim_text``, issue 51): whatever order claims of different shapes come in, each is
sent exactly the statement and parameters the reference (``statements.claim_statement``,
which hashes the shape every time) gives it; a shape met again is the kept statement,
and a shape that differs only in a probe's list length (one token or several, one queue
or several) is another. No database: statements are compared as text."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from sql_renderings import postgres_types

from tenure.adapters.core.store import Probe
from tenure.adapters.postgres import statements
from tenure.adapters.postgres.store import PostgresStore
from tenure.adapters.queue.table import QUEUE_BINDINGS, TASKS_BINDING
from tenure.kernel.queue import finders
from tenure.kernel.queue.machine import CLAIM_LEGACY_REWRITE, CLAIM_OWNED_REWRITE
from tenure.model import QueueKind


BINDINGS = [QUEUE_BINDINGS[QueueKind.VALIDATION], QUEUE_BINDINGS[QueueKind.PIPELINE], TASKS_BINDING]


@st.composite
def claims(draw: st.DrawFn) -> tuple[Any, ...]:
    """One claim's arguments as ``_Claim.in_one_statement`` builds them."""
    binding = draw(st.sampled_from(BINDINGS))
    owned = draw(st.booleans())
    tokens = draw(st.lists(st.sampled_from(["t1", "t2", "t3"]), min_size=1, max_size=3, unique=True))
    chosen: dict[str, Any] = {}
    one_queue = False
    if binding is TASKS_BINDING:
        queues = draw(st.lists(st.sampled_from(["mail", "sms", "hops"]), min_size=1, max_size=3, unique=True))
        one_queue = draw(st.booleans()) and len(queues) == 1
        chosen = {"queue": queues[0]} if one_queue else {"queues": queues}
    kind = QueueKind.TASK if binding is TASKS_BINDING else QueueKind.VALIDATION
    eligible, claimable = finders.claim_finders(kind, owned=owned, one_queue=one_queue)
    blockers = [Probe(finders.expired, {}, "exists", limit=1)]
    if owned:
        blockers.append(Probe(finders.tokens_stored, {"tokens": list(tokens)}, "exists", limit=1))
    rewrite = CLAIM_OWNED_REWRITE if owned else CLAIM_LEGACY_REWRITE
    return binding, Probe(eligible, chosen, "rows", limit=len(tokens)), claimable, blockers, rewrite, chosen


@settings(max_examples=200, deadline=None)
@given(st.lists(claims(), min_size=1, max_size=12))
def test_each_claim_is_sent_the_statement_and_parameters_of_the_reference(sequence: list[tuple[Any, ...]]) -> None:
    store = PostgresStore("postgresql://user@localhost/db")
    kept: dict[tuple[Any, ...], statements.ClaimText] = {}
    types = {binding.spec.name: postgres_types(binding) for binding in BINDINGS}
    for binding, pick, check, blockers, rewrite, chosen in sequence:
        expected_parameters: dict[str, Any] = {}
        expected_sql, expected_attributes = statements.claim_statement(
            binding, store.schema, pick, check, blockers, rewrite, types[binding.spec.name], expected_parameters, chosen)
        text = store._claim_text(binding, pick, check, blockers, rewrite, types[binding.spec.name])  # noqa: SLF001
        parameters: dict[str, Any] = {}
        statements.bind_claim(text, pick, blockers, chosen, parameters)
        assert (text.sql, text.attributes, parameters) == (expected_sql, expected_attributes, expected_parameters)
        assert text.statement is statements.numbered(expected_sql)
        # A shape met again is the kept statement.
        shape = (binding.spec.name, statements.probe_shape(pick), check, tuple(map(statements.probe_shape, blockers)),
                 rewrite)
        assert kept.setdefault(shape, text) is text


def test_one_token_and_several_are_different_statements() -> None:
    store = PostgresStore("postgresql://user@localhost/db")
    binding = QUEUE_BINDINGS[QueueKind.VALIDATION]
    types = postgres_types(binding)
    texts = []
    for tokens in (["t1"], ["t1", "t2"], ["t3"]):
        blockers = [Probe(finders.expired, {}, "exists", limit=1), Probe(finders.tokens_stored, {"tokens": tokens},
                                                                          "exists", limit=1)]
        texts.append(store._claim_text(binding, Probe(finders.eligible, {}, "rows", limit=len(tokens)),  # noqa: SLF001
                                       finders.claimable, blockers, CLAIM_OWNED_REWRITE, types))
    assert texts[0] is texts[2] and texts[0].sql != texts[1].sql
