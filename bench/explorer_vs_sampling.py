"""Explorer vs sampling (issue 34): how much sampling each kernel mutant needs.

For every deliberately broken kernel of ``tests/support/kernel_mutants.py`` this script
measures two things and prints them side by side, one markdown table per machine:

* the bounded exhaustive explorer (``tenure.conformance.explore``): the property that catches
  the mutant, the length of the shortest trace and the states explored to find it. It
  runs the same code the explorer tests run (``tests/conformance/explore/test_explore_queue.py``,
  ``test_explore_attempts.py``, ``test_explore_runs.py``), in a fresh interpreter per
  mutant, with the world each test names; the counts are deterministic, so once.
* the sampled behavioural suite (``BEHAVIOURAL_TESTS``): the same pytest command
  ``tests/kernel/test_mutants.py`` runs (``-x``, the mutant applied by
  ``TENURE_KERNEL_MUTANT``), once per ``--hypothesis-seed``, with a small probe plugin
  (``-p``) that records which test failed first and, for a Hypothesis test, how many test
  cases it ran before its first failing one (passing and invalid alike, in the order
  Hypothesis ran them), plus the wall and CPU seconds of the whole subprocess.

The probe reads Hypothesis's own per-test-case statistics (the ones
``--hypothesis-show-statistics`` summarises) through ``hypothesis.statistics.collector``,
because the summary's "N passing" is not the count before the failure: with
``report_multiple_bugs`` Hypothesis keeps generating for a while after the first failing
case (for one node mutant the summary says 2000 passing where the first failure came
after 1236). No test here is a ``RuleBasedStateMachine`` (the Run command-sequence
property draws its sequence with ``st.data()``), so steps are not reported.

The probe also loads a profile whose only change is ``database=None``: with the example
database each seed after the first would replay the failure the first one saved (and
``.hypothesis/`` may already hold failures from earlier mutant runs), which would measure
the database, not sampling. ``CI`` is removed from the subprocess's environment because
the CI profile derandomizes, which would make every seed the same run.

``--properties-only`` deselects the example-based tests, to see what sampling alone
finds when no hand-written example stands before it; ``--save`` keeps the raw figures and
``--load`` prints the report of a saved run again.

Usage::

    .venv/bin/python -P bench/explorer_vs_sampling.py [--machines queue,attempts,...]
        [--mutants name,...] [--seeds N] [--properties-only] [--json] [--save FILE] [--load FILE]

This is a benchmark: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["main"]

ROOT = pathlib.Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "tests" / "support"
EXPLORER_TESTS = ROOT / "tests" / "conformance" / "explore"
TIMEOUT_SECONDS = 600
MANY_EXAMPLES_MEDIAN = 50
MANY_EXAMPLES_ANY_SEED = 200
RUN_SIDE_MACHINES = ("runs", "consent", "agent_jobs", "recovery", "nodes")

PROBE_MODULE = "tenure_bench_sampling_probe"
PROBE_SOURCE = textwrap.dedent('''
    """Records, per test, its outcome and (for Hypothesis tests) the order of its test cases."""
    import json
    import os

    import pytest

    _OUT = os.environ["TENURE_BENCH_PROBE_OUT"]
    _RUNS = {}
    _LETTER = {"valid": "v", "invalid": "x", "overrun": "o", "interesting": "!"}
    """One letter per Hypothesis test case status ("!" is a failing test case)."""


    def _write(line):
        with open(_OUT, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\\n")


    def pytest_sessionstart(session):
        # tests/conftest.py has loaded its profile by now (initial conftests load before
        # the session starts) and no test module is imported yet: every @settings made
        # at collection inherits this profile, which only drops the example database.
        from hypothesis import settings

        settings.register_profile("tenure-bench-probe", parent=settings.default, database=None)
        settings.load_profile("tenure-bench-probe")
        _write({"profile": repr(settings.default)})


    def pytest_collection_modifyitems(session, config, items):
        # --properties-only: keep the Hypothesis tests alone (how much sampling finds a
        # mutant when no hand-written example stands before it).
        if os.environ.get("TENURE_BENCH_PROPERTIES_ONLY"):
            from hypothesis import is_hypothesis_test

            kept = [item for item in items if is_hypothesis_test(getattr(item, "obj", None))]
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
            items[:] = kept


    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_call(item):
        # Innermost wrapper: Hypothesis's own plugin has set its collector (for @given
        # tests); chain to it so --hypothesis-show-statistics still works.
        from hypothesis.statistics import collector

        outer = collector.value
        runs = _RUNS.setdefault(item.nodeid, [])

        def note(stats):
            phases = {}
            for phase in ("reuse", "generate", "shrink"):
                cases = stats.get(phase + "-phase", {}).get("test-cases", [])
                phases[phase] = {"statuses": "".join(_LETTER[case["status"]] for case in cases),
                                 "runtimes": [case["runtime"] for case in cases],
                                 "seconds": stats.get(phase + "-phase", {}).get("duration-seconds", 0.0)}
            runs.append({"phases": phases, "stopped_because": stats.get("stopped-because")})
            if outer is not None:
                outer(stats)

        with collector.with_value(note):
            yield


    def pytest_runtest_logreport(report):
        if report.when == "call" or report.outcome == "failed":
            _write({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                    "duration": report.duration, "runs": _RUNS.get(report.nodeid, []),
                    "longrepr": str(report.longrepr)[-1500:] if report.failed else None})
''')


# --- what the tests name -----------------------------------------------------------------


def _load(path: pathlib.Path) -> Any:
    """A module of the test suite, imported for its tables (no mutant is applied here)."""
    for folder in (str(SUPPORT), str(EXPLORER_TESTS)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _suite_tables() -> dict[str, Any]:
    mutants = _load(SUPPORT / "kernel_mutants.py")
    return {
        "mutants": {machine: sorted(names) for machine, names in mutants.MUTANTS.items()},
        "behavioural": mutants.BEHAVIOURAL_TESTS,
        "queue": _load(EXPLORER_TESTS / "test_explore_queue.py").CAUGHT_BY,
        "attempts": _load(EXPLORER_TESTS / "test_explore_attempts.py").CAUGHT_BY,
        "runs": _load(EXPLORER_TESTS / "test_explore_runs.py"),
    }


# --- the explorer --------------------------------------------------------------------------

# Each script is the code its explorer test runs, printing the states explored as well.
QUEUE_SCRIPT = textwrap.dedent("""
    import json, sys
    import kernel_mutants
    kernel_mutants.apply(sys.argv[1])
    from tenure.conformance.explore.engine import explore
    from tenure.conformance.explore.queue import STANDARD
    model, depth = STANDARD[int(sys.argv[2])]
    found = explore(model, max_depth=depth)
    violation = found.violation
    print(json.dumps({"world": f"STANDARD[{sys.argv[2]}] {model.name}", "states": found.states,
                      "property": None if violation is None else violation.property.name,
                      "actions": None if violation is None else len(violation.trace)}))
""")

ATTEMPT_SCRIPT = textwrap.dedent("""
    import json, sys
    import kernel_mutants
    kernel_mutants.apply(sys.argv[1])
    from tenure.conformance.explore.attempts import STANDARD, WORLD_PROPERTIES, AttemptModel
    from tenure.conformance.explore.engine import explore
    answer = {"world": None, "states": None, "property": None, "actions": None, "states_all_worlds": 0}
    for standard, max_depth in STANDARD:
        model = AttemptModel(standard.configuration, WORLD_PROPERTIES)
        result = explore(model, max_depth=max_depth)
        answer["states_all_worlds"] += result.states
        if result.violation is not None:
            answer.update(world=model.name, states=result.states, property=result.violation.property.name,
                          actions=len(result.violation.trace))
            break
    print(json.dumps(answer))
""")

RUN_SCRIPT = textwrap.dedent("""
    import json, sys
    import kernel_mutants
    kernel_mutants.apply(sys.argv[1])
    from tenure.conformance.explore import engine, runs
    model, depth = next((model, depth) for model, depth in runs.STANDARD if model.bounds.name == sys.argv[2])
    result = engine.explore(model, max_depth=depth, max_states=int(sys.argv[3]))
    found = result.violation
    print(json.dumps({"world": sys.argv[2], "states": result.states,
                      "property": None if found is None else found.property.name,
                      "actions": None if found is None else len(found.trace)}))
""")


def _explorer_command(machine: str, mutant: str, tables: dict[str, Any]) -> tuple[list[str], str | None]:
    """The interpreter command for one mutant, and why it is expected to be missed (if so)."""
    name = f"{machine}:{mutant}"
    if machine == "queue":
        configuration, _ = tables["queue"][mutant]
        return [QUEUE_SCRIPT, name, str(configuration)], None
    if machine == "attempts":
        return [ATTEMPT_SCRIPT, name], None
    runs = tables["runs"]
    if name in runs.CAUGHT:
        world = runs.CAUGHT[name][0]
        return [RUN_SCRIPT, name, world, str(runs.STATE_GUARD)], None
    world, why = runs.MISSED[name]
    return [RUN_SCRIPT, name, world, str(runs.STATE_GUARD)], why


def explore_mutant(machine: str, mutant: str, tables: dict[str, Any]) -> dict[str, Any]:
    arguments, expected_miss = _explorer_command(machine, mutant, tables)
    environment = _environment({"PYTHONPATH": str(SUPPORT)})
    with _timed() as clock:
        try:
            finished = subprocess.run([sys.executable, "-P", "-c", *arguments], cwd=ROOT, env=environment,
                                      capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            finished = None
    answer: dict[str, Any] = {"wall_seconds": clock["wall"], "cpu_seconds": clock["cpu"],
                              "expected_miss": expected_miss}
    if finished is None:
        return {**answer, "outcome": "timeout"}
    if finished.returncode != 0 or not finished.stdout.strip():
        return {**answer, "outcome": "error", "error": finished.stderr[-2000:]}
    answer.update(json.loads(finished.stdout.strip().splitlines()[-1]))
    answer["outcome"] = "missed" if answer["property"] is None else "caught"
    return answer


# --- the sampled suite ---------------------------------------------------------------------


def _environment(extra: dict[str, str]) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if key not in ("CI", "TENURE_KERNEL_MUTANT")}
    for key, value in extra.items():
        if key == "PYTHONPATH" and environment.get("PYTHONPATH"):
            value = os.pathsep.join([value, environment["PYTHONPATH"]])
        environment[key] = value
    return environment


@contextlib.contextmanager
def _timed() -> Iterator[dict[str, float]]:
    """Wall and CPU seconds of the children waited for inside the block (one at a time)."""
    clock: dict[str, float] = {}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    try:
        yield clock
    finally:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        clock["wall"] = time.perf_counter() - started
        clock["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _test_cases(run: dict[str, Any]) -> tuple[str, list[float]]:
    """A Hypothesis run's test cases before shrinking, in the order they ran."""
    statuses, runtimes = "", []
    for phase in ("reuse", "generate"):
        statuses += run["phases"][phase]["statuses"]
        runtimes += run["phases"][phase]["runtimes"]
    return statuses, runtimes


def _first_failure(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Which test failed first, and what sampling it (and the suite before it) needed."""
    examples_before_suite = 0
    for report in reports:
        runs = report["runs"]
        if report["outcome"] != "failed":
            examples_before_suite += sum(len(_test_cases(run)[0]) for run in runs)
            continue
        failed: dict[str, Any] = {"test": report["nodeid"], "when": report["when"], "kind": "example-based test",
                                  "examples": 0, "seconds_to_failure": 0.0}
        earlier = 0
        for run in runs:
            statuses, runtimes = _test_cases(run)
            if "!" in statuses:  # the first failing test case
                index = statuses.index("!")
                failed.update(kind="Hypothesis", examples=earlier + index,
                              passing=statuses[:index].count("v"),
                              invalid=statuses[:index].count("x") + statuses[:index].count("o"),
                              seconds_to_failure=sum(runtimes[: index + 1]), stopped_because=run["stopped_because"])
                break
            earlier += len(statuses)
        else:
            if runs:
                failed.update(kind="Hypothesis, no failing example (health check or error)", examples=earlier)
        failed["examples_in_suite_before"] = examples_before_suite + failed["examples"]
        failed["longrepr"] = report["longrepr"]
        return failed
    return {"test": None, "kind": "no test failed", "examples": None,
            "examples_in_suite_before": examples_before_suite}


def sample_mutant(machine: str, mutant: str, seed: int, tests: list[str], probe_folder: str,
                  properties_only: bool = False) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as handle:
        probe_out = handle.name
    extra = {"PYTHONPATH": probe_folder, "TENURE_KERNEL_MUTANT": f"{machine}:{mutant}",
             "TENURE_BENCH_PROBE_OUT": probe_out}
    if properties_only:
        extra["TENURE_BENCH_PROPERTIES_ONLY"] = "1"
    environment = _environment(extra)
    command = [sys.executable, "-P", "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", PROBE_MODULE,
               f"--hypothesis-seed={seed}", *tests]
    timed_out = False
    with _timed() as clock:
        try:
            finished = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True,
                                      timeout=TIMEOUT_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            timed_out, finished = True, None
    lines = [json.loads(line) for line in pathlib.Path(probe_out).read_text(encoding="utf-8").splitlines() if line]
    os.unlink(probe_out)
    profile = next((line["profile"] for line in lines if "profile" in line), "")
    answer: dict[str, Any] = {"seed": seed, "wall_seconds": clock["wall"], "cpu_seconds": clock["cpu"],
                              "returncode": None if finished is None else finished.returncode,
                              "timed_out": timed_out, "database_off": "database=None" in profile,
                              "tests_run": sum(1 for line in lines if "nodeid" in line)}
    answer.update(_first_failure([line for line in lines if "nodeid" in line]))
    if finished is not None and finished.returncode not in (0, 1):
        answer["harness_error"] = (finished.stdout[-2000:] + finished.stderr[-2000:])
    return answer


# --- the report ----------------------------------------------------------------------------


def _short(nodeid: str | None) -> str:
    if nodeid is None:
        return "none failed"
    path, _, name = nodeid.partition("::")
    return f"{pathlib.Path(path).stem}::{name}"


def _median(values: list[float]) -> float:
    return statistics.median(values)


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """One mutant's seeds in a few figures (an example-based first failure counts 0 examples)."""
    seeds = result["seeds"]
    examples = [seed["examples"] for seed in seeds if seed["test"] is not None]
    tests: dict[str, list[int]] = {}
    for seed in seeds:
        tests.setdefault(_short(seed["test"]), []).append(seed["seed"])
    return {
        "first_test": max(tests, key=lambda name: len(tests[name])), "tests": tests,
        "example_based_seeds": [seed["seed"] for seed in seeds if seed["kind"] == "example-based test"],
        "hypothesis_seeds": [seed["seed"] for seed in seeds if seed["kind"] == "Hypothesis"],
        "suite_examples_median": _median([seed["examples_in_suite_before"] for seed in seeds]),
        "examples_median": _median(examples) if examples else None,
        "examples_min": min(examples) if examples else None, "examples_max": max(examples) if examples else None,
        "seconds_median": _median([seed["wall_seconds"] for seed in seeds]),
        "cpu_median": _median([seed["cpu_seconds"] for seed in seeds]),
        "uncaught_seeds": [seed["seed"] for seed in seeds if seed["test"] is None],
        "behind_examples": [(seed["seed"], seed["examples_in_suite_before"]) for seed in seeds
                            if seed["kind"] == "example-based test" and seed["examples_in_suite_before"]],
    }


def _number(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:g}" if value != int(value) else f"{int(value)}"


def _explorer_cells(explorer: dict[str, Any]) -> tuple[str, str, str]:
    states = "–" if explorer.get("states") is None else f"{explorer['states']:,}"
    earlier = explorer.get("states_all_worlds", 0) - (explorer.get("states") or 0)
    if earlier > 0:
        states += f" (+{earlier:,} in the worlds tried before)"
    if explorer["outcome"] == "caught":
        return f"`{explorer['property']}`", str(explorer["actions"]), states
    return f"**{explorer['outcome']}** (world {explorer.get('world')})", "–", states


def _examples_cell(sampled: dict[str, Any]) -> str:
    if not sampled["hypothesis_seeds"] and sampled["example_based_seeds"] and not sampled["uncaught_seeds"]:
        return "0 (example-based test)"
    if sampled["examples_median"] is None:
        cell = "–"
    elif sampled["examples_min"] == sampled["examples_max"]:
        cell = _number(sampled["examples_median"])
    else:
        cell = (f"{_number(sampled['examples_median'])} "
                f"({_number(sampled['examples_min'])}–{_number(sampled['examples_max'])})")
    if sampled["example_based_seeds"]:
        cell += f"; example-based test with seed(s) {', '.join(map(str, sampled['example_based_seeds']))}"
    if sampled["uncaught_seeds"]:
        cell += f"; **no test failed with seed(s) {', '.join(map(str, sampled['uncaught_seeds']))}**"
    return cell


def table(machine: str, results: list[dict[str, Any]]) -> str:
    lines = [f"#### {machine}", "",
             ("| mutant | explorer: property | actions | states | sampled: first failing test "
             "| examples before the failing one, median (min–max) | suite examples before, median "
             "| seconds, median wall (CPU) |"),
             "|---|---|---:|---:|---|---:|---:|---:|"]
    for result in results:
        sampled = summarise(result)
        property_cell, actions, states = _explorer_cells(result["explorer"])
        tests = sampled["tests"]
        if len(tests) == 1:
            first = sampled["first_test"]
        else:
            first = "; ".join(f"{name} (seed {', '.join(map(str, seeds))})" for name, seeds in tests.items())
        seconds = f"{sampled['seconds_median']:.1f} ({sampled['cpu_median']:.1f})"
        lines.append(f"| `{result['mutant']}` | {property_cell} | {actions} | {states} | {first} "
                     f"| {_examples_cell(sampled)} | {_number(sampled['suite_examples_median'])} | {seconds} |")
    return "\n".join(lines)


def _seed_note(seed: dict[str, Any]) -> str:
    """What one seed needed, in words."""
    if seed["test"] is None:
        return f"seed {seed['seed']}: no test failed ({seed['examples_in_suite_before']} examples ran)"
    if seed["kind"] == "example-based test":
        before = seed["examples_in_suite_before"]
        tail = f", after the Hypothesis tests before it ran {before} examples without failing" if before else ""
        return f"seed {seed['seed']}: example-based test {_short(seed['test'])}{tail}"
    return f"seed {seed['seed']}: {seed['examples']} in {_short(seed['test'])}"


def _seeds_note(seeds: list[dict[str, Any]]) -> str:
    """What the seeds needed, in words (one test named once when every seed failed in it by sampling)."""
    tests = {seed["test"] for seed in seeds}
    if len(tests) == 1 and None not in tests and all(seed["kind"] == "Hypothesis" for seed in seeds):
        numbers = ", ".join(str(seed["examples"]) for seed in seeds)
        names = ", ".join(str(seed["seed"]) for seed in seeds)
        return f"{numbers} examples with seed {names} in {_short(seeds[0]['test'])}"
    return "; ".join(_seed_note(seed) for seed in seeds)


def compact_table(results: list[dict[str, Any]]) -> str:
    """Every machine in one table, the explorer in one cell (for the Hypothesis-tests-only pass)."""
    lines = [("| mutant | explorer: actions, states | first failing Hypothesis test "
             "| examples before the failing one, median (min–max) | examples run in all, median "
             "| seconds, median wall (CPU) |"),
             "|---|---:|---|---:|---:|---:|"]
    for result in results:
        sampled, explorer = summarise(result), result["explorer"]
        if explorer["outcome"] == "caught":
            found = f"{explorer['actions']}, {explorer['states']:,}"
        else:
            found = f"{explorer['outcome']} ({explorer.get('states') or 0:,} states)"
        first = "; ".join(f"{name} (seed {', '.join(map(str, seeds))})" if len(sampled["tests"]) > 1 else name
                          for name, seeds in sampled["tests"].items())
        seconds = f"{sampled['seconds_median']:.1f} ({sampled['cpu_median']:.1f})"
        lines.append(f"| `{result['machine']}:{result['mutant']}` | {found} | {first} | {_examples_cell(sampled)} "
                     f"| {_number(sampled['suite_examples_median'])} | {seconds} |")
    return "\n".join(lines)


def summary(results: list[dict[str, Any]]) -> str:
    many, missed, uncaught, behind_examples = [], [], [], []
    for result in results:
        sampled, explorer = summarise(result), result["explorer"]
        name = f"{result['machine']}:{result['mutant']}"
        per_seed = _seeds_note(result["seeds"])
        if explorer["outcome"] != "caught":
            missed.append(f"- `{name}`: explorer {explorer['outcome']} in world {explorer.get('world')} "
                          f"({explorer.get('states') or 0:,} states). Sampled: {per_seed}"
                          + (f". Known: {explorer['expected_miss']}" if explorer.get("expected_miss") else ""))
        elif sampled["examples_max"] is not None and (
                sampled["examples_median"] >= MANY_EXAMPLES_MEDIAN or sampled["examples_max"] > MANY_EXAMPLES_ANY_SEED):
            actions = explorer["actions"]
            many.append(f"- `{name}`: "
                        + ("" if len(result["seeds"]) == 1 else f"median {_examples_cell(sampled).split(';')[0]}: ")
                        + f"{per_seed}. "
                        f"Explorer: `{explorer['property']}` in {actions} action{'' if actions == 1 else 's'}, "
                        f"{explorer['states']:,} states")
        if sampled["behind_examples"]:
            counts = [before for _, before in sampled["behind_examples"]]
            seeds = ", ".join(str(seed) for seed, _ in sampled["behind_examples"])
            span = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
            tests = sorted({_short(seed["test"]) for seed in result["seeds"] if seed["kind"] == "example-based test"})
            behind_examples.append(f"- `{name}` (seed {seeds}): {span} examples of the Hypothesis tests before "
                                   f"{' / '.join(tests)} passed")
        if sampled["uncaught_seeds"]:
            uncaught.append(f"- `{name}`: {per_seed}")
    lines = [(f"Caught by the explorer but needing many samples (median >= {MANY_EXAMPLES_MEDIAN} examples, "
             f"or more than {MANY_EXAMPLES_ANY_SEED} with some seed):"), ""]
    lines += many or ["- none"]
    lines += ["", "Missed by the explorer:", ""] + (missed or ["- none"])
    if behind_examples:
        lines += ["", ("Caught first by an example-based test although Hypothesis tests ran before it "
                      "(they sampled without finding it):"), ""] + behind_examples
    lines += ["", "Never caught by the sampled suite with some seed:", ""] + (uncaught or ["- none"])
    return "\n".join(lines)


def measure(machines: list[str], keep: set[str] | None, seeds: int, properties_only: bool) -> dict[str, Any]:
    tables = _suite_tables()
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as probe_folder:
        (pathlib.Path(probe_folder) / f"{PROBE_MODULE}.py").write_text(PROBE_SOURCE, encoding="utf-8")
        for machine in machines:
            for mutant in tables["mutants"][machine]:
                if keep is not None and mutant not in keep:
                    continue
                explorer = explore_mutant(machine, mutant, tables)
                measured = [sample_mutant(machine, mutant, seed, tables["behavioural"][machine], probe_folder,
                                          properties_only)
                            for seed in range(1, seeds + 1)]
                results.append({"machine": machine, "mutant": mutant, "explorer": explorer, "seeds": measured})
                brief = summarise(results[-1])
                print(f"[{time.perf_counter() - started:7.0f} s] {machine}:{mutant}: explorer {explorer['outcome']}"
                      f" {explorer.get('property')} {explorer.get('actions')} actions {explorer.get('states')} states;"
                      f" sampled {brief['first_test']} examples {[seed['examples'] for seed in measured]}",
                      file=sys.stderr, flush=True)
    return {"command": " ".join([".venv/bin/python", "-P", "bench/explorer_vs_sampling.py", *sys.argv[1:]]),
            "date": datetime.date.today().isoformat(), "seeds": list(range(1, seeds + 1)),
            "properties_only": properties_only, "machines": machines,
            "total_seconds": time.perf_counter() - started, "results": results}


def render(report: dict[str, Any]) -> str:
    parts = []
    if report["properties_only"]:
        parts.append(compact_table(report["results"]))
    for machine in [] if report["properties_only"] else report["machines"]:
        rows = [result for result in report["results"] if result["machine"] == machine]
        if rows:
            parts.append(table(machine, rows))
    parts.append(summary(report["results"]))
    parts.append(f"Seeds {report['seeds']}{' (Hypothesis tests only)' if report['properties_only'] else ''}; "
                 f"total {report['total_seconds'] / 60:.1f} minutes.")
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", help="comma-separated machines (default: every one in MUTANTS)")
    parser.add_argument("--mutants", help="comma-separated mutant names to keep (default: all)")
    parser.add_argument("--seeds", type=int, default=3, help="Hypothesis seeds 1..N (default 3)")
    parser.add_argument("--json", action="store_true", help="print the raw measurements as JSON")
    parser.add_argument("--save", type=pathlib.Path, help="also write the raw measurements as JSON here")
    parser.add_argument("--properties-only", action="store_true",
                        help="run only the Hypothesis tests of BEHAVIOURAL_TESTS (deselect the example-based ones)")
    parser.add_argument("--load", type=pathlib.Path, help="report a --save file instead of measuring")
    arguments = parser.parse_args(argv)

    if arguments.load:
        report = json.loads(arguments.load.read_text(encoding="utf-8"))
    else:
        every = list(_suite_tables()["mutants"])
        machines = arguments.machines.split(",") if arguments.machines else every
        unknown = set(machines) - set(every)
        if unknown:
            parser.error(f"unknown machines {sorted(unknown)}; known: {every}")
        keep = set(arguments.mutants.split(",")) if arguments.mutants else None
        report = measure(machines, keep, arguments.seeds, arguments.properties_only)
    if arguments.save:
        arguments.save.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(json.dumps(report, indent=1) if arguments.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
