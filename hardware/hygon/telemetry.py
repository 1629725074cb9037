"""One TelemetrySample from hy-smi's ``--json`` show flags, with an estimated energy counter.

Not in the output these flags give (None in every sample, hardware.telemetry_fields.HY_SMI):
ECC counts, retired pages, remapped rows, clock-event reasons and XIDs. hy-smi has no energy counter that a public
sample shows, so ``energy_mj`` is an estimate: the trapezoidal integral of the power
readings one backend instance has taken; it starts at 0 and only grows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuflow.hardware.backend import TELEMETRY_FIELDS, TelemetrySample
from gpuflow.hardware.hygon import parse as hp
from gpuflow.hardware.hygon.command import HySmi
from gpuflow.hardware.hygon.fields import (
    F_MEM_TOTAL_B,
    F_MEM_TOTAL_MIB,
    F_MEM_USED_B,
    F_MEM_USED_MIB,
    F_POWER,
    F_POWER_CAP,
    F_SCLK,
    F_TEMP,
    F_USE,
)
from gpuflow.hardware.hygon.inventory import Dcu
from gpuflow.hardware.telemetry_fields import HY_SMI

# Every optional field hy-smi cannot give, as None: absent, not "no errors".
UNREADABLE: dict[str, None] = {f: None for f in TELEMETRY_FIELDS - HY_SMI}

TELEMETRY_ARGS = (
    "--showtemp",
    "--showpower",
    "--showuse",
    "--showmeminfo",
    "vram",
    "--showmaxpower",
    "--showclocks",
    "--json",
)


@dataclass
class Energy:
    """The running estimate of one DCU: the last reading and the integral so far."""

    last_t: float | None = None
    last_power_mw: int = 0
    energy_mj: float = 0.0


def sample(
    hy: HySmi,
    node_name: str,
    dcu: Dcu,
    energy: dict[int, Energy],
    clock: Callable[[], float],
) -> TelemetrySample:
    """Read ``dcu`` now and advance its entry in ``energy`` (readings on ``clock``)."""
    index = dcu.index
    args = list(TELEMETRY_ARGS)
    what = f"hy-smi {' '.join(args)}"
    proc = hy.run(args)
    cards = hp.parse_card_json(proc.stdout, what)
    now_wall = time.time()
    now = clock()
    if index not in cards:
        # hy-smi still answers for the others: this one fell off the bus.
        e = energy.get(index, Energy())
        return TelemetrySample(
            node=node_name,
            index=index,
            timestamp_s=now_wall,
            present=False,
            temperature_c=0.0,
            power_mw=0,
            energy_mj=int(e.energy_mj),
            utilization_ratio=0.0,
            memory_used_mb=0,
            memory_total_mb=dcu.memory_total_mb,
            sm_clock_mhz=0,
            power_limit_mw=0,
            **UNREADABLE,
        )
    card, raw = cards[index], proc.stdout

    def need(keys: tuple[str, ...]) -> float:
        v = hp.card_number(card, keys, what, raw)
        if v is None:
            raise hp.unexpected(what, raw, f"card{index} lacks {keys[0]!r}")
        return v

    temperature_c = need(F_TEMP)
    power_mw = int(round(need(F_POWER) * 1000))
    use_pct = need(F_USE)
    used = hp.card_memory_mb(card, F_MEM_USED_MIB, F_MEM_USED_B, what, raw)
    if used is None:
        raise hp.unexpected(what, raw, f"card{index} lacks {F_MEM_USED_MIB[0]!r}")
    total = (
        hp.card_memory_mb(card, F_MEM_TOTAL_MIB, F_MEM_TOTAL_B, what, raw) or dcu.memory_total_mb
    )
    cap_w = hp.card_number(card, F_POWER_CAP, what, raw)
    sclk = hp.card_text(card, F_SCLK)
    if not 0.0 <= use_pct <= 100.0:
        raise hp.unexpected(what, raw, f"card{index} utilisation {use_pct}% is outside 0..100")
    e = energy.setdefault(index, Energy())
    if e.last_t is not None and now > e.last_t:
        # Trapezoid over the interval, mW * s = mJ.
        e.energy_mj += (e.last_power_mw + power_mw) / 2.0 * (now - e.last_t)
    e.last_t, e.last_power_mw = now, power_mw
    return TelemetrySample(
        node=node_name,
        index=index,
        timestamp_s=now_wall,
        present=True,
        temperature_c=temperature_c,
        power_mw=power_mw,
        energy_mj=int(e.energy_mj),
        utilization_ratio=use_pct / 100.0,
        memory_used_mb=used,
        memory_total_mb=total,
        sm_clock_mhz=hp.clock_mhz(sclk, what, raw) if sclk else 0,
        power_limit_mw=int(round(cap_w * 1000)) if cap_w is not None else 0,
        **UNREADABLE,
    )
