"""The explorer's traces replayed against a real database: the owned queue
(:mod:`.queue`), the service-attempt machine (:mod:`.attempts`) and workflow Runs
(:mod:`.runs`), with what the last two share (:mod:`.common`). Unlike the explorer
itself these talk to a database: they import the lockstep room's raw SQL and the
drivers room's scratch area."""

__all__: list[str] = []
