"""The parameters of a Run's decided-ahead statement (``joined_ahead_sql``), built without
a database: every value equals the row encoded whole, each row is encoded once (the old
row; the new one only where its record changed), and the offsets of the times that move
with the clock are read off the decision's own paths (no record moved a microsecond to
find them), equal to what moving it finds."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tenure.adapters.core.engine import ahead as core_engine
from tenure.adapters.core.store import Expected
from tenure.adapters.postgres import statements
from tenure.adapters.core.tables import POSTGRESQL_DIALECT
from tenure.adapters.runs.engine import _parts
from tenure.adapters.runs.table import DELIVERIES_BINDING, RUNS_BINDING
from tenure.conformance.strategies.runs import NOW, base_run, delivery_for
from tenure.kernel.ahead import Ahead, decide_windowed
from tenure.kernel.core import Applied
from tenure.kernel.runs.commands import Claim, Containment, RecordPublished, Settle
from tenure.kernel.runs.machine import RUNS
from tenure.kernel.runs.record import RunPair
from tenure.model import DeliveryState, RunStatus


def _situations() -> dict[str, tuple[RunPair, Any]]:
    queued = base_run()
    running = base_run(status=RunStatus.RUNNING, started_at_us=NOW - 50, node="node-a")
    return {
        "claim": (RunPair(queued, (delivery_for(queued, DeliveryState.PUBLISHED),)), Claim(enqueue_seq=0, node="node-a")),
        "record_published": (RunPair(queued, (delivery_for(queued, DeliveryState.PENDING),)),
                             RecordPublished(enqueue_seq=0)),
        "settle": (RunPair(running, (delivery_for(running, DeliveryState.CLAIMED),)),
                   Settle(enqueue_seq=0, status=RunStatus.DONE, error=None, result_json='{"answer":42}',
                          containment=Containment(open_jobs=0, open_attempts=0))),
    }


def _planned(name: str) -> tuple[RunPair, Ahead]:
    pair, command = _situations()[name]
    plan = decide_windowed(RUNS, pair, command, NOW)
    assert plan is not None and isinstance(plan.decision, Applied) and plan.relative
    return pair, plan


def _moved_a_microsecond(plan: Ahead, news: list[tuple[Any, Any]]) -> list[dict[str, int]]:
    """The reference derivation: every field that moved by exactly the microsecond."""
    later = plan.at(NOW + 1)
    assert isinstance(later, Applied)
    return [core_engine.moving_fields(row, moved, NOW) for (_, row), (_, moved) in zip(
        news, _parts(later.new_record), strict=True)]


@pytest.mark.parametrize("name", sorted(_situations()))
def test_the_moving_times_of_each_row_are_read_off_the_decisions_paths_and_equal_moving_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, plan = _planned(name)
    news = _parts(plan.decision.new_record)  # type: ignore[union-attr]
    expected = _moved_a_microsecond(plan, news)
    assert any(expected), "some row moves with the clock"
    moved: list[int] = []
    at = Ahead.at
    monkeypatch.setattr(Ahead, "at", lambda self, now_us: moved.append(now_us) or at(self, now_us))
    assert core_engine.moving_by_row(plan, _parts, news, NOW) == expected
    assert moved == [], "no record moved to find them"


def test_a_moving_time_in_no_row_given_falls_back_to_moving_the_record() -> None:
    # A row list that does not hold the decided rows themselves (copies): found by
    # identity nowhere, the offsets are read off the record moved a microsecond.
    _, plan = _planned("claim")
    news = [(binding, dataclasses.replace(row)) for binding, row in _parts(plan.decision.new_record)]  # type: ignore[union-attr]
    assert core_engine.moving_by_row(plan, _parts, news, NOW) == _moved_a_microsecond(plan, news)


def _counting(binding: Any) -> tuple[Any, list[Any]]:
    codec = binding.codec(POSTGRESQL_DIALECT)
    encoded: list[Any] = []

    def write(record: Any) -> dict[str, Any]:
        encoded.append(record)
        return codec.write(record)

    return dataclasses.replace(codec, write=write), encoded


@pytest.mark.parametrize("name", sorted(_situations()))
def test_each_row_of_a_joined_statement_is_encoded_once_and_its_parameters_equal_the_whole_encoding(name: str) -> None:
    pair, plan = _planned(name)
    news = _parts(plan.decision.new_record)  # type: ignore[union-attr]
    relative = core_engine.moving_by_row(plan, _parts, news, NOW)
    for (binding, old), (_, new), moving, prefix in zip(_parts(pair), news, relative, ("a_", "b_"), strict=True):
        item = Expected(getattr(old, binding.key_field), old, new=None if new == old else new, relative=moving)
        codec, encoded = _counting(binding)
        parameters = statements.joined_ahead_parameters(binding, codec, item, prefix)
        assert parameters is not None
        assert encoded == [old], "the old row once, the new one only where it changed"
        whole_old, whole_new = codec.write(old), codec.write(new) if item.new is not None else {}
        spec = binding.spec
        assert parameters[f"{prefix}present"] is True and parameters[f"{prefix}write"] is (item.new is not None)
        assert {c: parameters[f"{prefix}old_{c}"] for c in spec.column_names} == whole_old
        for c in spec.mutable_names:
            assert parameters[f"{prefix}new_{c}"] == whole_new.get(c), c
            if c in spec.instant_names:
                assert parameters[f"{prefix}rel_{c}"] == {binding.column_of(f).name: o for f, o in moving.items()}.get(c)
            else:
                assert parameters[f"{prefix}check_{c}"] == whole_new.get(c), c
    assert {binding for binding, _ in news} == {RUNS_BINDING, DELIVERIES_BINDING}
