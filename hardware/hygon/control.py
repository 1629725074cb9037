"""Clocks and power cap of one DCU through rocm-smi-style flags.

``--showclkfrq``, ``--setsclk LEVEL..``, ``--resetclocks``, ``--showmaxpower`` and
``--setpoweroverdrive WATTS``. Only ``--showmaxpower`` is seen in public hy-smi use, so the
others are used only when ``hy-smi -h`` lists them; otherwise the call raises
UnsupportedError naming the flag. Every setter validates its input before it runs.
"""

from __future__ import annotations

from gpuflow.hardware.backend import ClockState, HardwareError, InvalidRequestError, PowerLimits
from gpuflow.hardware.hygon import parse as hp
from gpuflow.hardware.hygon.command import HySmi, is_int
from gpuflow.hardware.hygon.fields import F_POWER_CAP
from gpuflow.hardware.hygon.inventory import Dcu
from gpuflow.hardware.skus import SKUS


def clock_levels(hy: HySmi, dcu: Dcu) -> hp.ClockLevels:
    """The sclk DPM levels of ``dcu`` and the one in use."""
    hy.require_flags("reading clock levels", "--showclkfrq")
    what = f"hy-smi -d {dcu.index} --showclkfrq"
    proc = hy.run(["-d", str(dcu.index), "--showclkfrq"])
    levels = hp.parse_clock_levels(proc.stdout, what).get(dcu.index, {}).get("sclk")
    if levels is None or not levels.levels:
        raise hp.unexpected(what, proc.stdout, f"no sclk levels for DCU {dcu.index}")
    return levels


def clock_state(hy: HySmi, dcu: Dcu, locked: tuple[int, int] | None) -> ClockState:
    """hy-smi has no getter for a lock: ``locked`` is what this process set."""
    levels = clock_levels(hy, dcu)
    mhz = [m for _lvl, m in levels.levels]
    current = levels.current_mhz
    if current is None:
        raise HardwareError(f"hy-smi -d {dcu.index} --showclkfrq marks no current sclk level")
    return ClockState(
        sm_clock_mhz=current,
        sm_clock_min_mhz=min(mhz),
        sm_clock_max_mhz=max(mhz),
        locked_min_mhz=locked[0] if locked else None,
        locked_max_mhz=locked[1] if locked else None,
    )


def lock_clocks(hy: HySmi, dcu: Dcu, min_mhz: int, max_mhz: int) -> tuple[int, int]:
    """Allow only the sclk levels in [min_mhz, max_mhz]; the span they enforce is returned."""
    if not is_int(min_mhz) or not is_int(max_mhz):
        raise InvalidRequestError(f"clocks must be ints in MHz, got {min_mhz!r}, {max_mhz!r}")
    if min_mhz <= 0 or min_mhz > max_mhz:
        raise InvalidRequestError(f"need 0 < min_mhz <= max_mhz, got {min_mhz}, {max_mhz}")
    hy.require_flags("locking clocks", "--showclkfrq", "--setsclk")
    levels = clock_levels(hy, dcu)
    table = ", ".join(f"{lvl}:{m}MHz" for lvl, m in levels.levels)
    chosen = [(lvl, m) for lvl, m in levels.levels if min_mhz <= m <= max_mhz]
    if not chosen:
        raise InvalidRequestError(
            f"no sclk level of DCU {dcu.index} lies in {min_mhz}..{max_mhz} MHz (levels {table})"
        )
    hy.run(["-d", str(dcu.index), "--setsclk", *[str(lvl) for lvl, _m in chosen]])
    # What is enforced is the chosen levels' span, which is what we report back.
    return (min(m for _l, m in chosen), max(m for _l, m in chosen))


def reset_clocks(hy: HySmi, dcu: Dcu) -> None:
    hy.require_flags("resetting clocks", "--resetclocks")
    hy.run(["-d", str(dcu.index), "--resetclocks"])


def power_limits(hy: HySmi, dcu: Dcu) -> PowerLimits:
    """The cap from ``--showmaxpower``; the range from the SKU table when the model is known.

    hy-smi shows no cap range that any public sample has; for an unknown model the range
    collapses to the current cap, so set_power_limit accepts only that value.
    """
    index = dcu.index
    what = "hy-smi --showmaxpower --json"
    proc = hy.run(["--showmaxpower", "--json"])
    cards = hp.parse_card_json(proc.stdout, what)
    if index not in cards:
        raise hp.unexpected(what, proc.stdout, f"no card{index}")
    cap_w = hp.card_number(cards[index], F_POWER_CAP, what, proc.stdout)
    if cap_w is None:
        raise hp.unexpected(what, proc.stdout, f"card{index} lacks {F_POWER_CAP[0]!r}")
    cap = int(round(cap_w * 1000))
    spec = SKUS.get(dcu.sku)
    if spec is None:
        return PowerLimits(limit_mw=cap, min_limit_mw=cap, max_limit_mw=cap, default_limit_mw=cap)
    return PowerLimits(
        limit_mw=cap,
        min_limit_mw=min(spec.power_min_limit_mw, cap),
        max_limit_mw=max(spec.power_max_limit_mw, cap),
        default_limit_mw=spec.power_default_limit_mw,
    )


def set_power_limit(hy: HySmi, dcu: Dcu, limit_mw: int) -> None:
    """Set the cap in whole watts within power_limits' range, and check that it took."""
    index = dcu.index
    if not is_int(limit_mw):
        raise InvalidRequestError(f"limit_mw must be an int, got {limit_mw!r}")
    if limit_mw % 1000:
        raise InvalidRequestError(
            f"hy-smi takes whole watts; {limit_mw} mW is not a multiple of 1000"
        )
    hy.require_flags("setting the power cap", "--showmaxpower", "--setpoweroverdrive")
    limits = power_limits(hy, dcu)
    if not limits.min_limit_mw <= limit_mw <= limits.max_limit_mw:
        raise InvalidRequestError(
            f"power limit {limit_mw} mW is outside {limits.min_limit_mw}..{limits.max_limit_mw} mW "
            f"for DCU {index}"
        )
    proc = hy.run(["-d", str(index), "--setpoweroverdrive", str(limit_mw // 1000)])
    after = power_limits(hy, dcu).limit_mw
    if after != limit_mw:
        raise HardwareError(
            f"hy-smi --setpoweroverdrive answered {hp.quote(proc.stdout)} but the cap of DCU "
            f"{index} reads {after} mW, not {limit_mw} mW"
        )
