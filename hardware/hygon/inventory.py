"""What a host's DCUs are and offer: models, memory, vDCU budgets and MIG profiles.

Read once per backend (hy-smi ``--json`` for the cards, ``virtual -show-device-info`` for
the vDCU budgets, ``mig -lgip``/``-lgipp`` for MIG) and cached until refresh(). A missing
``virtual`` or ``mig`` subcommand is not an error: the DCU just offers less, and a note
says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuflow.hardware.backend import HardwareError, PartitionProfile
from gpuflow.hardware.hygon import parse as hp
from gpuflow.hardware.hygon.command import HySmi
from gpuflow.hardware.hygon.fields import F_MEM_TOTAL_B, F_MEM_TOTAL_MIB, F_SERIES, F_UNIQUE_ID


def sku_name_for(series: str) -> str:
    """Map hy-smi's "Card Series" onto hardware/skus.py names; unknown ones stay raw."""
    s = series.upper()
    if "K100" in s:
        return "Hygon DCU K100"
    if "Z100" in s:
        return "Hygon DCU Z100"
    return series


@dataclass(frozen=True)
class Dcu:
    index: int
    series: str
    sku: str
    uuid: str
    memory_total_mb: int
    compute_units: int  # vDCU compute budget; 0 when `hy-smi virtual` does not list it
    vdcu_memory_mb: int  # vDCU memory budget ("Global memory")
    mig_profiles: tuple[PartitionProfile, ...] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        out: list[str] = []
        if self.compute_units > 0:
            out.append("vdcu")
        if self.mig_profiles:
            out.append("mig")
        return tuple(out)


@dataclass
class Inventory:
    devices: dict[int, Dcu]
    notes: list[str] = field(default_factory=list)  # why vDCU/MIG is absent, for humans


def load_inventory(hy: HySmi, node_name: str) -> Inventory:
    """Every DCU hy-smi lists, with its budgets; runs only read-only commands."""
    args = ["--showproductname", "--showuniqueid", "--showmeminfo", "vram", "--json"]
    what = f"hy-smi {' '.join(args)}"
    proc = hy.run(args)
    cards = hp.parse_card_json(proc.stdout, what)
    notes: list[str] = []
    virtual = _virtual_devices(hy, notes)
    mig = _mig_profiles(hy, notes)
    devices: dict[int, Dcu] = {}
    for index, card in sorted(cards.items()):
        series = hp.card_text(card, F_SERIES)
        if series is None:
            raise hp.unexpected(
                what, proc.stdout, f"card{index} has no product name ({F_SERIES[0]!r})"
            )
        memory = hp.card_memory_mb(card, F_MEM_TOTAL_MIB, F_MEM_TOTAL_B, what, proc.stdout)
        if memory is None:
            raise hp.unexpected(what, proc.stdout, f"card{index} has no total memory")
        uid = hp.card_text(card, F_UNIQUE_ID) or f"hygon-{node_name}-dcu{index}"
        v = virtual.get(index)
        devices[index] = Dcu(
            index=index,
            series=series,
            sku=sku_name_for(series),
            uuid=uid,
            memory_total_mb=memory,
            compute_units=v.compute_units if v else 0,
            vdcu_memory_mb=v.memory_mb if v else 0,
            mig_profiles=tuple(mig.get(index, ())),
        )
    return Inventory(devices=devices, notes=notes)


def _virtual_devices(hy: HySmi, notes: list[str]) -> dict[int, hp.VirtualInfo]:
    proc = hy.run(["virtual", "-show-device-info"], check=False)
    if proc.returncode != 0:
        # Drivers before 6.2.26 ship `hy-virtual` instead; no vDCU through hy-smi then.
        notes.append(
            f"`hy-smi virtual` unavailable (status {proc.returncode}): {hp.quote(proc.stderr or proc.stdout, 200)}"
        )
        return {}
    infos = hp.parse_virtual_info(
        proc.stdout, virtual=False, what="hy-smi virtual -show-device-info"
    )
    return {i.actual_device: i for i in infos}


def _mig_profiles(hy: HySmi, notes: list[str]) -> dict[int, list[PartitionProfile]]:
    proc = hy.run(["mig", "-lgip"], check=False)
    if proc.returncode != 0 and not hp.mig_none_found(proc.stdout):
        notes.append(
            f"`hy-smi mig` unavailable (status {proc.returncode}): {hp.quote(proc.stderr or proc.stdout, 200)}"
        )
        return {}
    rows = hp.parse_mig_profiles(proc.stdout, "hy-smi mig -lgip")
    if not rows:
        notes.append("`hy-smi mig -lgip` lists no profiles (MIG mode off or no driver support)")
        return {}
    placements = hp.parse_mig_placements(hy.run(["mig", "-lgipp"]).stdout, "hy-smi mig -lgipp")
    out: dict[int, list[PartitionProfile]] = {}
    for r in rows:
        if (r.device, r.profile_id) not in placements:
            raise HardwareError(
                f"hy-smi mig -lgipp gives no placements for profile {r.name} (id {r.profile_id}) "
                f"on DCU {r.device}"
            )
        starts, size = placements[(r.device, r.profile_id)]
        out.setdefault(r.device, []).append(
            PartitionProfile(
                name=r.name,
                kind="mig",
                profile_id=r.profile_id,
                compute_slices=size,  # a Hygon slice carries compute and memory together
                memory_mb=r.memory_mb,
                max_count=r.total,
                placement_starts=starts,
                placement_size=size,
            )
        )
    return out
