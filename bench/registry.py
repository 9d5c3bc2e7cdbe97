"""The scenario registry, the timing loop and the table printer."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# One operation repeated n times; the runner divides n by the elapsed time.
Loop = Callable[[int], None]


@dataclass(frozen=True)
class Variants:
    candidate: Loop
    baseline: Loop | None = None
    candidate_label: str = "candidate"
    baseline_label: str = "baseline"
    teardown: Callable[[], None] | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    build: Callable[[], Variants]
    n: int = 10_000
    quick_n: int = 1_000
    target: float | None = None  # minimum candidate/baseline ratio


@dataclass(frozen=True)
class Row:
    """One printed line of a measured scenario: figures already formatted."""

    candidate: str
    value: str
    baseline: str = "-"
    baseline_value: str = "-"
    ratio: str = "-"
    target: str = "-"
    ok: bool = True


@dataclass(frozen=True)
class Measured:
    """A scenario that runs its own processes and reports rows (not an ops loop)."""

    name: str
    description: str
    measure: Callable[[Context], list[Row]]


@dataclass(frozen=True)
class Context:
    quick: bool
    runs: int
    workdir: Path


SCENARIOS: dict[str, Scenario | Measured] = {}


def scenario(
    name: str, description: str, *, n: int = 10_000, quick_n: int = 1_000, target: float | None
) -> Callable[[Callable[[], Variants]], Callable[[], Variants]]:
    def register(build: Callable[[], Variants]) -> Callable[[], Variants]:
        SCENARIOS[name] = Scenario(name, description, build, n, quick_n, target)
        return build

    return register


def measured(
    name: str, description: str
) -> Callable[[Callable[[Context], list[Row]]], Callable[[Context], list[Row]]]:
    def register(measure: Callable[[Context], list[Row]]) -> Callable[[Context], list[Row]]:
        SCENARIOS[name] = Measured(name, description, measure)
        return measure

    return register


@dataclass(frozen=True)
class Result:
    scenario: Scenario
    variants: Variants
    candidate_ops: float
    baseline_ops: float | None

    @property
    def ratio(self) -> float | None:
        if self.baseline_ops is None:
            return None
        return self.candidate_ops / self.baseline_ops

    @property
    def ok(self) -> bool:
        target = self.scenario.target
        return target is None or (self.ratio is not None and self.ratio >= target)


def _seconds(loop: Loop, n: int) -> float:
    started = time.perf_counter()
    loop(n)
    return time.perf_counter() - started


def run(item: Scenario, *, quick: bool, runs: int, chunk: int = 200) -> Result:
    """Median over ``runs`` of ops/s; each run alternates baseline and candidate chunks.

    Alternating small chunks makes both sides see the same machine: on a shared
    VM the speed drifts over seconds, which long separate runs turn into noise.
    """
    variants = item.build()
    n = item.quick_n if quick else item.n
    chunk = min(chunk, n)
    try:
        _seconds(variants.candidate, chunk)  # warm up: connections, script cache
        if variants.baseline is not None:
            _seconds(variants.baseline, chunk)
        candidate: list[float] = []
        baseline: list[float] = []
        for _ in range(runs):
            spent = {"candidate": 0.0, "baseline": 0.0}
            for _ in range(max(1, n // chunk)):
                if variants.baseline is not None:
                    spent["baseline"] += _seconds(variants.baseline, chunk)
                spent["candidate"] += _seconds(variants.candidate, chunk)
            done = max(1, n // chunk) * chunk
            candidate.append(done / spent["candidate"])
            if variants.baseline is not None:
                baseline.append(done / spent["baseline"])
    finally:
        if variants.teardown is not None:
            variants.teardown()
    return Result(
        item,
        variants,
        statistics.median(candidate),
        statistics.median(baseline) if baseline else None,
    )


def result_rows(result: Result) -> list[Row]:
    ratio = result.ratio
    target = result.scenario.target
    return [
        Row(
            result.variants.candidate_label,
            f"{result.candidate_ops:,.0f}/s",
            result.variants.baseline_label if result.baseline_ops is not None else "-",
            f"{result.baseline_ops:,.0f}/s" if result.baseline_ops is not None else "-",
            f"{ratio:.2f}x" if ratio is not None else "-",
            f">= {target:.2f}x" if target is not None else "-",
            result.ok,
        )
    ]


def table(results: list[tuple[str, list[Row]]]) -> str:
    header = ["scenario", "candidate", "value", "baseline", "value", "ratio", "target", ""]
    rows = [header]
    for name, printed in results:
        for line in printed:
            rows.append(
                [
                    name,
                    line.candidate,
                    line.value,
                    line.baseline,
                    line.baseline_value,
                    line.ratio,
                    line.target,
                    "ok" if line.ok else "BELOW TARGET",
                ]
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    numeric = {2, 4, 5}
    lines = []
    for index, row in enumerate(rows):
        cells = [
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)
