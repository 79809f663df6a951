"""What a migration checked, and the refusal it raises when a database is wrongly prepared."""

from __future__ import annotations

import dataclasses

from tenure.model import ConfigValidationError

__all__ = ["Check", "MigrationReport", "refuse_if_failed"]


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    """One admission check: which table and column, what was required, and the verdict."""

    table: str
    subject: str
    requirement: str
    passed: bool
    problem: str = ""
    """An authored snake_case word naming what was wrong (empty when passed)."""


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationReport:
    database: str
    """``sqlite`` or ``postgresql`` (never the URL)."""
    applied: tuple[str, ...]
    """Schema steps applied by this run (empty when already up to date)."""
    checks: tuple[Check, ...]

    def lines(self) -> list[str]:
        shown = [f"database: {self.database}", f"applied: {', '.join(self.applied) or 'nothing (up to date)'}"]
        for check in self.checks:
            verdict = "ok" if check.passed else f"REFUSED ({check.problem})"
            shown.append(f"  {check.table}.{check.subject}: {check.requirement}: {verdict}")
        return shown


def refuse_if_failed(checks: list[Check]) -> None:
    """Raise one ConfigValidationError naming every failed check (no identifiers quoted)."""
    failed = [check for check in checks if not check.passed]
    if failed:
        raise ConfigValidationError(
            "migration_admission_refused",
            fields=tuple(f"{check.table}.{check.subject}" for check in failed),
            problems=tuple(check.problem for check in failed),
        )
