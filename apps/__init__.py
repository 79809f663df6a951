"""The applications built on the library, on the top floor: the ``tenure`` command
(``cli``) and its subcommands (``worker_cli``, ``jobs_cli``, ``runs_cli``,
``health_cli``), the health probe (``health``), metrics and tracing (``metrics``), the
logging setup (``logs``), the demos it runs (``demo``, ``demo_attempts``,
``demo_runs``), the web console (``console``) and the Alembic helper (``alembic``).

They know the wiring (``tenure.adapters``) and, for ``tenure conform`` only,
``tenure.conformance.command``; nothing in ``tenure.model``, ``tenure.kernel``,
``tenure.adapters`` or ``tenure.conformance`` imports them
(``tests/adapters/core/test_floor_plan.py`` holds the rule; ``specs/README.md``, "Where
things live").
"""

__all__: list[str] = []
