"""tenure.kernel: pure, total decision functions. No I/O, no clock, no randomness.

``tenure.kernel.core`` holds what every machine shares (rows, rules, decisions,
finders, ``decide``) and ``tenure.kernel.ahead`` the decisions made ahead of a write.
Each machine has its own folder: ``queue/`` (the owned queue), ``attempts/`` (service
job attempts), ``runs/`` (workflow Runs and their deliveries), ``consents/`` and
``agent_jobs/`` (the owners a Run waits for), ``messages/`` (a Run's messages and the
receives that wait for them), ``nodes/`` (node leases), and two decision tables that are
not state machines: ``recovery/`` (what startup reconciliation and relays do with a Run)
and ``replay/`` (what a replayed workflow's call does at its journal position). See
``specs/`` for the tables reviewers read and the invariants every decision keeps.

Exported here: the core (``Machine``, ``Row``, ``Rule``, ``Applied``, ``Refused``,
``Decision``), every machine by name (``QUEUE``, ``ATTEMPTS``, ``RUNS``, ``CONSENTS``,
``AGENT_JOBS``, ``NODES``, ``MESSAGES``; ``machine.decide(record, command, now_us)``) and
:data:`MACHINES`, where a machine is registered. A machine's records, commands, replies
and named rules are imported from its folder (``tenure.kernel.queue.commands``,
``tenure.kernel.queue.record``, ...).

Every machine names its parts alike: ``<Machine>Step`` (the states of its table),
``<Machine>Row`` (its record), ``<Machine>CommandType`` and ``<Machine>Refusal``.
"""

from __future__ import annotations

from .agent_jobs.machine import AGENT_JOBS
from .attempts.machine import ATTEMPTS
from .consents.machine import CONSENTS
from .core import Applied, Decision, Machine, Refused, Row, Rule
from .messages.machine import MESSAGES
from .nodes.machine import NODES
from .queue.machine import QUEUE
from .runs.machine import RUNS

__all__ = [
    "Machine",
    "Row",
    "Rule",
    "Applied",
    "Refused",
    "Decision",
    "QUEUE",
    "ATTEMPTS",
    "RUNS",
    "CONSENTS",
    "AGENT_JOBS",
    "NODES",
    "MESSAGES",
    "MACHINES",
]

MACHINES: tuple[Machine, ...] = (QUEUE, ATTEMPTS, RUNS, CONSENTS, AGENT_JOBS, NODES, MESSAGES)
"""Every machine, registered once: the adapters' registry (its tables), the spec-table
checks and the shared tests read this tuple; a machine's folder is :attr:`Machine.folder`
(``kernel/<folder>/``, ``adapters/<folder>/``). Registering a machine is importing it
above and naming it here (``specs/README.md``, "Adding a machine")."""
