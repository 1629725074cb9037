"""Parsers for ``hy-smi`` output, kept apart from the backend so they can be tested on text.

Every parser is defensive: output it does not recognise raises HardwareError quoting the
offending text (truncated), never a KeyError three frames later. Shapes, and where they
come from (Hygon publishes no manual for hy-smi's output; these are the public samples):

- ``hy-smi virtual -show-device-info`` / ``-show-vdevice-info``: blocks ``Device 0:`` or
  ``Virtual Device 0:`` followed by ``Actual Device: 0``, ``Compute units: 60`` and
  ``Global memory: 34342961152 bytes`` (HAMi's vDCU guide; Yunion cloudpods parses the same).
  The guide's sample also carries a stray ``- 5 -`` line, so unknown lines inside a block
  are skipped rather than fatal. No public sample shows the answer when no vDCU exists; an
  empty answer or one saying "no virtual device" means none.
- ``--json``: ``{"card0": {"<field>": "<string>"}, ...}`` (categraf's hy_smi input, zstack,
  swanlab, all run on real DCUs). Field names differ by driver generation ("DCU use (%)"
  and the newer "HCU use (%)"; "vram Total Memory (MiB)" where rocm-smi has "VRAM Total
  Memory (B)"), so lookups take a list of candidate names. Some builds print a banner
  before the JSON, so the object is cut out between the first "{" and the last "}".
- Text mode lines: ``HCU[0]\t\t: vram Total Used Memory (MiB): 3`` (older drivers print
  ``DCU[0]``; rocm-smi prints ``GPU[0]``), used here for ``--showclkfrq``.
- ``hy-smi mig``: GPUStack's Hygon runbook states that it mirrors ``nvidia-smi mig`` flag
  for flag, so ``-lgip``/``-lgipp``/``-lgi`` are parsed in nvidia-smi's table layout. No
  real hy-smi MIG table is public; this is the most speculative parser here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gpuflow.hardware.backend import HardwareError

MIB = 1024 * 1024
QUOTE_LIMIT = 600


def quote(text: str | bytes | None, limit: int = QUOTE_LIMIT) -> str:
    """The output as a one-line repr, cut to ``limit`` characters with the cut said."""
    if text is None:
        return "''"
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text.strip()
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f" ... [{len(text) - limit} more characters]"


def unexpected(what: str, text: str | bytes | None, why: str) -> HardwareError:
    return HardwareError(f"unexpected output from {what}: {why}; output was {quote(text)}")


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bytes|byte|b|kib|kb|mib|mb|gib|gb)?\s*$", re.I)
_SIZE_MIB = {
    "bytes": 1 / MIB,
    "byte": 1 / MIB,
    "b": 1 / MIB,
    "kib": 1 / 1024,
    "kb": 1 / 1024,
    "mib": 1.0,
    "mb": 1.0,
    "gib": 1024.0,
    "gb": 1024.0,
}


def size_to_mib(value: str, what: str, context: str) -> int:
    """'34342961152 bytes' -> 32752. A bare number is bytes, as hy-smi prints them."""
    m = _SIZE.match(value)
    if not m:
        raise unexpected(what, context, f"cannot read a memory size from {value!r}")
    unit = (m.group(2) or "bytes").lower()
    return int(float(m.group(1)) * _SIZE_MIB[unit])


# -- hy-smi virtual ------------------------------------------------------------------


@dataclass(frozen=True)
class VirtualInfo:
    """One block of ``-show-device-info`` (physical) or ``-show-vdevice-info`` (virtual)."""

    index: int  # "Device N" / "Virtual Device N"
    actual_device: int  # the physical DCU
    compute_units: int
    memory_mb: int


_HEADER = {
    False: re.compile(r"^\s*Device\s+(\d+)\s*:\s*$"),
    True: re.compile(r"^\s*Virtual\s+Device\s+(\d+)\s*:\s*$", re.I),
}
_FIELD = re.compile(r"^\s*(Actual Device|Compute units|Global memory)\s*:\s*(.+?)\s*$", re.I)
_NO_VDEVICE = re.compile(r"\bno\s+(?:virtual\s+)?v?devices?\b|\bnot\s+found\b", re.I)


def parse_virtual_info(text: str, virtual: bool, what: str) -> list[VirtualInfo]:
    """Parse ``hy-smi virtual -show-device-info`` (virtual=False) or ``-show-vdevice-info``."""
    header = _HEADER[virtual]
    blocks: list[tuple[int, dict[str, str]]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        h = header.match(line)
        if h:
            blocks.append((int(h.group(1)), {}))
            continue
        f = _FIELD.match(line)
        if f and blocks:
            blocks[-1][1][f.group(1).lower()] = f.group(2)
    if not blocks:
        if not text.strip() or (virtual and _NO_VDEVICE.search(text)):
            return []
        kind = "'Virtual Device N:'" if virtual else "'Device N:'"
        raise unexpected(what, text, f"no {kind} block found")
    out = []
    for number, fields in blocks:
        missing = [k for k in ("compute units", "global memory") if k not in fields]
        if missing:
            raise unexpected(what, text, f"device block {number} lacks {', '.join(missing)}")
        actual = fields.get("actual device", str(number))
        if not actual.isdigit() or not fields["compute units"].isdigit():
            raise unexpected(what, text, f"device block {number} has a non-integer field")
        out.append(
            VirtualInfo(
                index=number,
                actual_device=int(actual),
                compute_units=int(fields["compute units"]),
                memory_mb=size_to_mib(fields["global memory"], what, text),
            )
        )
    return out


# -- --json ----------------------------------------------------------------------------

_CARD_KEY = re.compile(r"^card(\d+)$", re.I)


def parse_card_json(text: str, what: str) -> dict[int, dict[str, str]]:
    """``{"card0": {...}}`` -> {0: {...}}; other top-level keys ("system") are skipped."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise unexpected(what, text, "no JSON object in the output")
    try:
        payload = json.loads(text[start : end + 1])
    except json.JSONDecodeError as exc:
        raise unexpected(what, text, f"invalid JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(payload, dict):
        raise unexpected(what, text, "the JSON is not an object")
    cards: dict[int, dict[str, str]] = {}
    for key, value in payload.items():
        m = _CARD_KEY.match(str(key))
        if not m:
            continue
        if not isinstance(value, dict):
            raise unexpected(what, text, f"{key!r} is not an object")
        cards[int(m.group(1))] = {str(k): str(v) for k, v in value.items()}
    if not cards:
        raise unexpected(what, text, "no 'cardN' entries")
    return cards


def _missing(value: str) -> bool:
    return value.strip().upper() in ("", "N/A", "NA", "NONE", "UNSUPPORTED")


def card_text(card: dict[str, str], keys: tuple[str, ...]) -> str | None:
    """The first of ``keys`` that the card reports (not N/A), or None."""
    for k in keys:
        if k in card and not _missing(card[k]):
            return card[k].strip()
    return None


def card_number(card: dict[str, str], keys: tuple[str, ...], what: str, raw: str) -> float | None:
    """The first reported number among ``keys``; a present but unreadable value raises."""
    value = card_text(card, keys)
    if value is None:
        return None
    m = _NUMBER.search(value)
    if not m:
        raise unexpected(what, raw, f"field {keys[0]!r} is not a number: {value!r}")
    return float(m.group(0))


def card_memory_mb(
    card: dict[str, str], mib_keys: tuple[str, ...], byte_keys: tuple[str, ...], what: str, raw: str
) -> int | None:
    """Memory in MiB from a '(MiB)' field (hy-smi) or a '(B)' field (rocm-smi)."""
    mib = card_number(card, mib_keys, what, raw)
    if mib is not None:
        return int(mib)
    b = card_number(card, byte_keys, what, raw)
    return None if b is None else int(b) // MIB


def clock_mhz(value: str, what: str, raw: str) -> int:
    """'(1500Mhz)' or '1500Mhz' -> 1500."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*mhz", value, re.I)
    if not m:
        raise unexpected(what, raw, f"cannot read a clock from {value!r}")
    return int(float(m.group(1)))


# -- text mode ---------------------------------------------------------------------------

_TEXT_LINE = re.compile(r"^\s*(?:DCU|HCU|GPU)\[(\d+)\]\s*:\s?(.*?)\s*$")
_CLK_SECTION = re.compile(r"Supported\s+(\w+)\s+frequencies", re.I)
_CLK_LEVEL = re.compile(r"^(\d+)\s*:\s*(\d+(?:\.\d+)?)\s*mhz\s*(\*)?\s*$", re.I)


@dataclass(frozen=True)
class ClockLevels:
    levels: tuple[tuple[int, int], ...]  # (DPM level, MHz), in level order
    current_level: int | None  # the level marked '*'

    @property
    def current_mhz(self) -> int | None:
        for level, mhz in self.levels:
            if level == self.current_level:
                return mhz
        return None


def parse_clock_levels(text: str, what: str) -> dict[int, dict[str, ClockLevels]]:
    """``--showclkfrq`` text -> {device: {"sclk": ClockLevels, "mclk": ...}}."""
    raw: dict[int, dict[str, list[tuple[int, int, bool]]]] = {}
    section: dict[int, str] = {}
    for line in text.splitlines():
        m = _TEXT_LINE.match(line)
        if not m:
            continue
        dev, body = int(m.group(1)), m.group(2)
        s = _CLK_SECTION.search(body)
        if s:
            section[dev] = s.group(1).lower()
            raw.setdefault(dev, {}).setdefault(section[dev], [])
            continue
        lv = _CLK_LEVEL.match(body)
        if lv and dev in section:
            raw[dev][section[dev]].append(
                (int(lv.group(1)), int(float(lv.group(2))), bool(lv.group(3)))
            )
    if not raw:
        raise unexpected(what, text, "no 'Supported <clock> frequencies' section")
    out: dict[int, dict[str, ClockLevels]] = {}
    for dev, clocks in raw.items():
        out[dev] = {}
        for name, entries in clocks.items():
            current = [lvl for lvl, _mhz, star in entries if star]
            out[dev][name] = ClockLevels(
                levels=tuple((lvl, mhz) for lvl, mhz, _s in entries),
                current_level=current[0] if current else None,
            )
    return out


_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def parse_help_flags(text: str) -> frozenset[str]:
    """Every option named in ``hy-smi -h`` (the setters are wired only if listed)."""
    return frozenset(_FLAG.findall(text))


# -- hy-smi mig (nvidia-smi mig layout) ------------------------------------------------------


@dataclass(frozen=True)
class MigProfileRow:
    device: int
    name: str  # "2g.15gb" (without the "MIG " prefix)
    profile_id: int
    free: int
    total: int
    memory_mb: int
    compute_units: int | None  # the table's SM column, CUs on a DCU


@dataclass(frozen=True)
class MigInstanceRow:
    device: int
    name: str
    profile_id: int
    instance_id: int
    start: int
    size: int


_LGIP_ROW = re.compile(
    r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+(\d+(?:\.\d+)?)\s+\S+\s+(\d+)?"
)
_LGIPP_ROW = re.compile(
    r"GPU\s+(\d+)\s+Profile\s+ID\s+(\d+)\s+Placements\s*:\s*\{([\d,\s]*)\}\s*:\s*(\d+)", re.I
)
_LGI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")
_NO_MIG = re.compile(r"\bNo\s+(?:MIG-enabled\s+devices|GPU\s+instances?)\b[^\n]*found", re.I)


def mig_none_found(text: str) -> bool:
    """nvidia-smi's wording when MIG is off or no instance exists (it exits non-zero then)."""
    return bool(_NO_MIG.search(text))


def parse_mig_profiles(text: str, what: str) -> list[MigProfileRow]:
    """``hy-smi mig -lgip``; [] when the tool says no MIG-enabled device exists."""
    if mig_none_found(text):
        return []
    if "GPU instance profiles" not in text:
        raise unexpected(what, text, "no 'GPU instance profiles' table")
    rows = []
    for line in text.splitlines():
        m = _LGIP_ROW.match(line.strip())
        if m:
            rows.append(
                MigProfileRow(
                    device=int(m.group(1)),
                    name=m.group(2),
                    profile_id=int(m.group(3)),
                    free=int(m.group(4)),
                    total=int(m.group(5)),
                    memory_mb=round(float(m.group(6)) * 1024),
                    compute_units=int(m.group(7)) if m.group(7) else None,
                )
            )
    return rows


def parse_mig_placements(
    text: str, what: str
) -> dict[tuple[int, int], tuple[tuple[int, ...], int]]:
    """``hy-smi mig -lgipp`` -> {(device, profile id): (starts, size)}."""
    out: dict[tuple[int, int], tuple[tuple[int, ...], int]] = {}
    for m in _LGIPP_ROW.finditer(text):
        starts = tuple(int(s) for s in m.group(3).replace(" ", "").split(",") if s)
        out[(int(m.group(1)), int(m.group(2)))] = (starts, int(m.group(4)))
    if not out and not mig_none_found(text):
        raise unexpected(what, text, "no 'GPU N Profile ID P Placements: {..}:S' line")
    return out


def parse_mig_instances(text: str, what: str) -> list[MigInstanceRow]:
    """``hy-smi mig -lgi``; [] when the tool says no GPU instance exists."""
    if mig_none_found(text):
        return []
    if "GPU instances" not in text:
        raise unexpected(what, text, "no 'GPU instances' table")
    rows = []
    for line in text.splitlines():
        m = _LGI_ROW.match(line.strip())
        if m:
            rows.append(
                MigInstanceRow(
                    device=int(m.group(1)),
                    name=m.group(2),
                    profile_id=int(m.group(3)),
                    instance_id=int(m.group(4)),
                    start=int(m.group(5)),
                    size=int(m.group(6)),
                )
            )
    return rows
