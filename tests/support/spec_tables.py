"""Read the Markdown spec tables and render their Mermaid diagrams.

A spec row is ``| from | command | guard | to | effect or refusal |``. ``from`` may list
several states (comma separated): the row then stands for one row per state. ``to`` may
be ``same`` (the state it came from). The last cell is an effect name or
``refuse <reason>``. Rows of one ``(from, command)`` pair are listed in evaluation
order: the first row whose guard holds decides.

Run ``python tests/support/spec_tables.py --write`` to re-render the diagram embedded in each
spec file after changing its rows (a test fails while a committed diagram is stale).
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import tenure.kernel

SPEC_DIR = pathlib.Path(__file__).resolve().parents[2] / "specs"
HEADER = ("from", "command", "guard", "to", "effect or refusal")
DIAGRAM_START = "<!-- diagram:start (rendered by tests/support/spec_tables.py from the rows above) -->"
DIAGRAM_END = "<!-- diagram:end -->"
MACHINES = {machine.name: machine for machine in tenure.kernel.MACHINES}
"""Every registered machine, by its name (its spec file is ``specs/<name>.md``)."""


@dataclasses.dataclass(frozen=True)
class SpecRow:
    source: str
    command: str
    guard: str
    target: str
    outcome: str
    refusal: bool

    @property
    def key(self) -> tuple[str, str]:
        return (self.source, self.command)


def _cells(line: str) -> list[str]:
    return [cell.strip().replace("`", "").strip() for cell in line.strip().strip("|").split("|")]


def parse_rows(text: str) -> list[SpecRow]:
    """Every transition row of every table with the transition header, in file order."""
    rows: list[SpecRow] = []
    in_table = False
    for line in text.splitlines():
        if not line.strip().startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if tuple(cells) == HEADER:
            in_table = True
            continue
        if not in_table or set("".join(cells)) <= set("-: "):
            continue
        if len(cells) != 5:
            raise ValueError(f"spec row does not have five cells: {line!r}")
        sources, command, guard, target, outcome = cells
        refusal = outcome.startswith("refuse ")
        for source in (name.strip() for name in sources.split(",")):
            rows.append(
                SpecRow(
                    source,
                    command,
                    guard,
                    source if target == "same" else target,
                    outcome.removeprefix("refuse ").strip(),
                    refusal,
                )
            )
    return rows


def read_spec(machine: str) -> str:
    return (SPEC_DIR / f"{machine}.md").read_text(encoding="utf-8")


def render_mermaid(rows: list[SpecRow], states: list[str], initial: str, title: str) -> str:
    """The machine's state-changing rows as a Mermaid state diagram, drawn by `transitions`.

    Refusals and rows that keep the state are left out (the tables list them); one edge
    is drawn per (from, to, command). Styling lines that depend on a model's current
    state are stripped so the text is stable.
    """
    from transitions.extensions import GraphMachine

    edges: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row.refusal or row.source == row.target:
            continue
        commands = edges.setdefault((row.source, row.target), [])
        if row.command not in commands:
            commands.append(row.command)
    transitions = [
        {"trigger": " / ".join(commands), "source": source, "dest": target}
        for (source, target), commands in edges.items()
    ]

    class _Model:
        pass

    machine = GraphMachine(
        model=_Model(),
        states=states,
        transitions=transitions,
        initial=initial,
        auto_transitions=False,
        graph_engine="mermaid",
        show_conditions=False,
        title=title,
    )
    source = machine.get_graph().draw(None)
    kept = [
        line.rstrip()
        for line in source.splitlines()
        if not line.strip().startswith(("classDef", "Class "))
    ]
    return "\n".join(kept).strip() + "\n"


def embedded_diagram(text: str) -> str:
    start = text.index(DIAGRAM_START) + len(DIAGRAM_START)
    end = text.index(DIAGRAM_END)
    block = text[start:end].strip()
    return block.removeprefix("```mermaid").removesuffix("```").strip() + "\n"


def with_diagram(text: str, diagram: str) -> str:
    start = text.index(DIAGRAM_START) + len(DIAGRAM_START)
    end = text.index(DIAGRAM_END)
    return text[:start] + "\n```mermaid\n" + diagram + "```\n" + text[end:]


def title_of(text: str) -> str:
    """A diagram's title: the spec's heading without its article and its parenthesis
    (``# The owned queue machine`` -> ``owned queue machine``)."""
    heading = text.splitlines()[0].removeprefix("# ").split(" (")[0]
    return heading.removeprefix("The ").removeprefix("the ")


def render_for(machine: str) -> str:
    """The diagram of the registered machine named ``machine`` (its spec file's name): its
    states in the order the kernel declares them, from its initial state."""
    kernel = MACHINES[machine]
    text = read_spec(machine)
    return render_mermaid(parse_rows(text), [state.value for state in kernel.states], kernel.initial.value,
                          title_of(text))


def main(argv: list[str]) -> int:
    write = "--write" in argv
    stale = []
    for machine in MACHINES:
        path = SPEC_DIR / f"{machine}.md"
        text = path.read_text(encoding="utf-8")
        diagram = render_for(machine)
        if embedded_diagram(text) != diagram:
            stale.append(machine)
            if write:
                path.write_text(with_diagram(text, diagram), encoding="utf-8")
    if stale and not write:
        print("stale diagrams:", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
