"""What a migration checked and did, and the refusal it raises when a database is wrongly prepared."""

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
    direction: str
    """``upgrade`` or ``downgrade``."""
    changed: tuple[str, ...]
    """Schema steps applied (upgrade) or removed (downgrade) by this run."""
    checks: tuple[Check, ...]
    statements: tuple[str, ...] = ()
    """Every statement the run executed, in order (``tenure migrate --sql`` prints them)."""
    dry_run: bool = False
    """True when nothing was committed (``--sql``): the statements were run and rolled back."""

    @property
    def applied(self) -> tuple[str, ...]:
        return self.changed if self.direction == "upgrade" else ()

    def summary(self) -> str:
        if self.direction == "upgrade":
            done = f"applied: {', '.join(self.changed) or 'nothing (up to date)'}"
        else:
            done = f"removed: {', '.join(self.changed) or 'nothing to remove'}"
        passed = sum(check.passed for check in self.checks)
        tail = f"; {passed} of {len(self.checks)} checks passed" if self.checks else ""
        return done + tail + (" (dry run: rolled back)" if self.dry_run else "")

    def lines(self, *, verbose: bool = False) -> list[str]:
        """The report as ``tenure migrate`` prints it: the database and the summary, then
        each failed check; ``verbose`` lists every check (about two hundred)."""
        shown = [f"database: {self.database}", self.summary()]
        for check in self.checks:
            if verbose or not check.passed:
                verdict = "ok" if check.passed else f"REFUSED ({check.problem})"
                shown.append(f"  {check.table}.{check.subject}: {check.requirement}: {verdict}")
        return shown


def refuse_if_failed(checks: list[Check], reason: str = "migration_admission_refused") -> None:
    """Raise one ConfigValidationError naming every failed check (no identifiers quoted)."""
    failed = [check for check in checks if not check.passed]
    if failed:
        raise ConfigValidationError(
            reason,
            fields=tuple(f"{check.table}.{check.subject}" for check in failed),
            problems=tuple(check.problem for check in failed),
        )
