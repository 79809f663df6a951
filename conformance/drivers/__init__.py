"""What the server and the store primitives must do, proven on a real database: the
server facts tenure's guarantees rest on (:mod:`.facts`), the store primitives' suite for
every (database, machine table) (:mod:`.stores`), and the scratch area every proof on a
user's database works in (:mod:`.scratch`). Imports the lockstep room (its example
databases, its loop, its raw SQL) and the strategies."""

__all__: list[str] = []
