"""The applications built on the library: the ``tenure`` command (``cli``) and its
subcommands (``worker_cli``, ``runs_cli``), and the demos it runs (``demo``,
``demo_attempts``, ``demo_runs``)."""

__all__: list[str] = []
