"""Choosing victims: free ``need`` units while losing the least work.

The work a victim loses is what it did since its last checkpoint (device-seconds: its
devices x the time since that checkpoint): checkpoint-and-stop saves it, but only if the
checkpoint succeeds, and the restart repeats the warm-up either way; the fewer such
seconds at stake, the cheaper the eviction. An elastic job above its minimum can instead
*shrink*: it gives up its surplus units through a checkpoint and keeps running on the rest.

Exact minimum-cost cover is a knapsack; a decision must take milliseconds, so this is the
classic greedy (cheapest work per freed unit first) followed by a pruning pass that drops
any chosen victim the others already cover, costliest first. Ties go to the lower
priority, then to the bigger victim (fewer evictions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    job_id: str
    units: tuple[str, ...]  # the units it would give, useful to the request
    cost: float  # work at risk (device-seconds)
    priority: int
    shrink: bool = False  # an elastic job giving only its surplus


@dataclass(frozen=True)
class Choice:
    candidate: Candidate
    release: tuple[str, ...]  # units it frees (a shrink frees only what is needed)


def choose_victims(need: int, candidates: Sequence[Candidate]) -> list[Choice] | None:
    """The victims that free at least ``need`` units at least cost; None if impossible."""
    if need <= 0:
        return []
    usable = [c for c in candidates if c.units]
    if sum(len(c.units) for c in usable) < need:
        return None
    order = sorted(
        usable,
        key=lambda c: (c.cost / len(c.units), c.priority, -len(c.units), c.job_id),
    )
    chosen: list[Candidate] = []
    got = 0
    for c in order:
        chosen.append(c)
        got += len(c.units)
        if got >= need:
            break
    for c in sorted(chosen, key=lambda c: (-c.cost, -c.priority, c.job_id)):
        if got - len(c.units) >= need:
            chosen.remove(c)
            got -= len(c.units)
    # The greedy can take one big cheap-per-unit victim where one small one would do:
    # a single victim covering the need alone, if cheaper, wins (the classic fix that
    # bounds the greedy's error for covering problems).
    single = min(
        (c for c in usable if len(c.units) >= need),
        key=lambda c: (c.cost, c.priority, len(c.units), c.job_id),
        default=None,
    )
    if single is not None and single.cost < sum(c.cost for c in chosen):
        chosen = [single]
    out: list[Choice] = []
    left = need
    for c in chosen:
        # A shrink gives only what is still needed; a preempted job frees everything.
        give = c.units[: max(0, left)] if c.shrink else c.units
        if c.shrink and not give:
            continue
        out.append(Choice(c, tuple(give)))
        left -= len(give)
    return out
