"""The scratch area ``tenure conform`` works in, so that nothing of the user's is touched.

PostgreSQL: a new schema with a random name (or one the caller names, refused if it
exists) in the database the URL names, migrated by tenure's own ``upgrade``; every
lockstep run gets it back empty (every table a run wrote is truncated; the rows the
migration itself wrote are checked unchanged), and it is dropped at the end. The URL
keeps every parameter the user gave (``pooler=transaction`` included); only its
``schema`` names the scratch schema.

SQLite: a new folder beside the database file (same file system, same locking), holding
one migrated template; each run gets a fresh copy of it, and the folder is removed at
the end. The user's file is never opened.

Refusals carry a reason word (:class:`ScratchRefused`): ``unreachable``,
``authentication_failed``, ``database_missing``, ``read_only_role`` (the role may not
create a schema or write), ``scratch_schema_exists``, ``sqlite_folder_missing``,
``sqlite_folder_not_writable``; never the URL, a name from it, or driver text.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import secrets
import shutil
import urllib.parse
from typing import Any

from tenure.adapters.core.urls import check_schema_name, parse_db_url
from tenure.model import TenureError

from tenure.conformance.lockstep.raw import connect, run_async

__all__ = ["ScratchArea", "ScratchRefused", "open_scratch", "with_schema"]

CONNECT_TIMEOUT_S = 10.0


class ScratchRefused(Exception):
    """The scratch area cannot be made here; ``reason`` says why in one word."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


SCRATCH_COMMENT = "tenure conform scratch area: safe to drop"
"""Every scratch schema carries this comment, so a leftover (a process killed outright)
can be found: ``SELECT nspname FROM pg_namespace n JOIN pg_description d ON d.objoid =
n.oid WHERE d.description = '...'``."""


def with_schema(db_url: str, schema: str) -> str:
    """``db_url`` with its ``schema`` query parameter set to ``schema``: only the query
    string is rebuilt, every other part and parameter kept as written (a URL with no host,
    ``postgresql:///db?host=...``, stays one)."""
    base, _, query = db_url.partition("?")
    pairs = [(name, value) for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True)
             if name != "schema"]
    pairs.append(("schema", schema))
    return base + "?" + urllib.parse.urlencode(pairs)


_DRIVER_REASONS = (
    ("InvalidPasswordError", "authentication_failed"),
    ("InvalidAuthorizationSpecificationError", "authentication_failed"),
    ("InvalidCatalogNameError", "database_missing"),
    ("InsufficientPrivilegeError", "read_only_role"),
    ("ReadOnlySQLTransactionError", "read_only_role"),
    ("DuplicateSchemaError", "scratch_schema_exists"),
    ("ReservedNameError", "scratch_schema_reserved"),
)
"""asyncpg's exception class names, mapped to the reason words a refusal carries."""


def _reason_of(error: BaseException) -> str:
    for name, reason in _DRIVER_REASONS:
        if any(kind.__name__ == name for kind in type(error).__mro__):
            return reason
    return "unreachable"


class ScratchArea:
    """An :class:`~tenure.conformance.lockstep.harness.ExampleDatabases` inside the user's
    database (see the module's docstring). Build it with :func:`open_scratch`."""

    def __init__(self, kind: str, url: str, *, folder: pathlib.Path | None = None,
                 schema: str | None = None, admin_url: str | None = None) -> None:
        self.kind = kind
        self.url = url
        self.admin_url = admin_url or url
        """The URL the scratch schema is made and dropped over (the user's own)."""
        """The scratch area's own URL (PostgreSQL: the user's URL naming the scratch schema)."""
        self.folder = folder
        self.schema = schema
        self._template_rows: dict[str, list[tuple[Any, ...]]] = {}
        self._copies = 0

    # --- ExampleDatabases ----------------------------------------------------------------

    def acquire(self, workdir: pathlib.Path) -> str:
        if self.kind == "sqlite":
            assert self.folder is not None
            self._copies += 1
            target = self.folder / f"run-{self._copies}.db"
            shutil.copyfile(self.folder / "template.db", target)
            return f"sqlite:///{target}"
        run_async(self._empty())
        return self.url

    def release(self, db_url: str, *, reuse: bool) -> None:
        if self.kind == "sqlite":
            path = pathlib.Path(db_url.split(":///", 1)[1])
            for suffix in ("", "-wal", "-shm", "-journal"):
                pathlib.Path(f"{path}{suffix}").unlink(missing_ok=True)

    # --- PostgreSQL ---------------------------------------------------------------------

    async def _tables(self, connection: Any) -> list[tuple[str, bool]]:
        """(table, written) for every table of the scratch schema: a table never written
        since it was made or truncated has no page."""
        rows = await connection.fetch(
            "SELECT c.relname, pg_relation_size(c.oid) > 0 FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r' ORDER BY c.relname",
            self.schema,
        )
        return [(name, used) for name, used in rows]

    async def _rows(self, connection: Any, name: str) -> list[tuple[Any, ...]]:
        return sorted(tuple(row) for row in await connection.fetch(f'SELECT * FROM "{self.schema}"."{name}"'))

    async def _remember_template(self) -> None:
        connection = await connect(self.url)
        try:
            for name, used in await self._tables(connection):
                if used:
                    self._template_rows[name] = await self._rows(connection, name)
        finally:
            await connection.close()

    async def _empty(self) -> None:
        """Back to what the migration left: truncate every table a run wrote; the
        migration's own rows must be unchanged (a run that changed them diverged from
        anything tenure does, and is reported as a failed reset)."""
        connection = await connect(self.url)
        try:
            for name, rows in self._template_rows.items():
                if await self._rows(connection, name) != rows:
                    raise ScratchRefused("scratch_reset_failed")
            written = [name for name, used in await self._tables(connection)
                       if used and name not in self._template_rows]
            if written:
                await connection.execute(
                    "TRUNCATE " + ", ".join(f'"{self.schema}"."{name}"' for name in written) + " RESTART IDENTITY")
        finally:
            await connection.close()

    async def drop(self) -> None:
        """Remove the scratch area (and nothing else)."""
        if self.kind == "sqlite":
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
            return
        connection = await connect(self.admin_url)
        try:
            await connection.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        finally:
            await connection.close()


async def open_scratch(db_url: str, *, schema: str | None = None) -> ScratchArea:
    """Make and migrate a scratch area in the database ``db_url`` names (see the module's
    docstring); raises :class:`ScratchRefused` with a reason word, having left nothing
    behind, when it cannot."""
    from tenure.adapters import upgrade

    target = parse_db_url(db_url)
    if target.kind.value == "sqlite":
        folder = pathlib.Path(target.location).resolve().parent
        if not folder.is_dir():
            raise ScratchRefused("sqlite_folder_missing")
        if not os.access(folder, os.W_OK):
            raise ScratchRefused("sqlite_folder_not_writable")
        if pathlib.Path(target.location).is_dir():
            raise ScratchRefused("sqlite_path_is_a_folder")
        if schema is not None:
            raise ScratchRefused("sqlite_has_no_schemas")
        scratch = folder / f".tenure-conform-{secrets.token_hex(6)}"
        try:
            scratch.mkdir()
        except OSError:
            raise ScratchRefused("sqlite_folder_not_writable") from None
        area = ScratchArea("sqlite", f"sqlite:///{scratch / 'template.db'}", folder=scratch)
        try:
            await upgrade(area.url)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        return area
    name = check_schema_name(schema, "scratch_schema") if schema is not None else (
        f"tenure_conform_{secrets.token_hex(6)}")
    if name.lower().startswith("pg_"):
        raise ScratchRefused("scratch_schema_reserved")
    area = ScratchArea("postgresql", with_schema(db_url, name), schema=name, admin_url=db_url)
    parse_db_url(area.url)  # the scratch URL must be one tenure reads as the user's, before anything is made
    try:
        connection = await asyncio.wait_for(connect(db_url), CONNECT_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - every failure becomes a reason word
        raise ScratchRefused(_reason_of(error)) from None
    created = False
    try:
        await connection.execute(f'CREATE SCHEMA "{name}"')
        created = True
        await connection.execute(f"COMMENT ON SCHEMA \"{name}\" IS '{SCRATCH_COMMENT}'")
    except BaseException as error:  # an interrupt too: what was made is dropped
        await connection.close()
        if created:
            await area.drop()
        if isinstance(error, Exception):
            raise ScratchRefused(_reason_of(error)) from None
        raise
    await connection.close()
    try:
        await upgrade(area.url, own_schema=True)
        await area._remember_template()
    except BaseException as error:
        await area.drop()
        if isinstance(error, TenureError):
            raise  # tenure's own refusal (a pooler detected, say) says it best
        if isinstance(error, Exception) and not isinstance(error, ScratchRefused):
            raise ScratchRefused(_reason_of(error)) from None
        raise
    return area
