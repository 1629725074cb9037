#!/usr/bin/env python3
"""A stand-in for Hygon's ``hy-smi`` that keeps its state in a JSON file.

Output shapes follow the public samples quoted in hardware/hygon/parse.py: the
``hy-smi virtual`` blocks from HAMi's vDCU guide, ``--json`` as ``{"card0": {...}}`` with
string values, text lines as ``DCU[0]\t\t: ...``, and ``hy-smi mig`` tables in
nvidia-smi's layout. Where no public sample exists (errors, the answer when no vDCU
exists, clock levels) the wording is this fake's own; the backend must not depend on it.

Environment:
  FAKE_HY_SMI_STATE  path of the state file (required); a default two-DCU host is written
                     there when the file does not exist.
  FAKE_HY_SMI_LOG    if set, every invocation's argv is appended to it as one JSON line.
  FAKE_HY_SMI_MODE   "garbage": print junk and exit 0 for every command;
                     "fail": exit 1 with a driver error for every command;
                     "noop": accept create/destroy commands, print success, change nothing.

State keys: devices[] (index, series, vendor, unique_id, compute_units, memory_mib,
temperature_c, power_w, use_pct, mem_used_mib, max_power_w, power_range_w, sclk_mhz[],
sclk_level, present, mig_profiles[]), vdevices[], gpu_instances[], control (whether the
clock/power setters exist), mig and virtual (whether those subcommands exist), label
("DCU" or "HCU", the text-mode prefix); a device's hide_fields[] drops JSON fields.
"""

from __future__ import annotations

import json
import os
import sys

MIB = 1024 * 1024
MAX_VDEVICES = 4


def default_state() -> dict:
    def dcu(index: int) -> dict:
        return {
            "index": index,
            "series": "Z100L",
            "vendor": "Chengdu Haiguang IC Design Co., Ltd.",
            "unique_id": f"DCU0Z100{index:04d}",
            "compute_units": 60,
            "memory_mib": 32752,
            "temperature_c": 41.0 + index,
            "power_w": 120.0,
            "use_pct": 35.0,
            "mem_used_mib": 1024,
            "max_power_w": 300.0,
            "power_range_w": [100, 300],
            "sclk_mhz": [300, 800, 1200, 1500],
            "sclk_level": 3,
            "present": True,
            "mig_profiles": [],
        }

    return {
        "label": "DCU",
        "control": True,
        "mig": False,
        "devices": [dcu(0), dcu(1)],
        "vdevices": [],
        "gpu_instances": [],
    }


class Fail(Exception):
    def __init__(self, message: str, status: int = 1, stdout: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.stdout = stdout


def load(path: str) -> dict:
    if not os.path.exists(path):
        save(path, default_state())
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def save(path: str, state: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(state, fh, indent=1)
    os.replace(tmp, path)


def device(state: dict, raw: str) -> dict:
    if not raw.isdigit():
        raise Fail(f"Error: invalid device id {raw!r}", 2)
    for d in state["devices"]:
        if d["index"] == int(raw) and d.get("present", True):
            return d
    raise Fail(f"Error: device {raw} does not exist", 1)


def int_list(raw: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in raw.split(",")]
    except ValueError:
        raise Fail(f"Error: invalid {what} list {raw!r}", 2) from None
    return values


# -- hy-smi virtual ----------------------------------------------------------------------


def cmd_virtual(state: dict, args: list[str], mode: str) -> tuple[str, bool]:
    opts: dict[str, str | bool] = {}
    takes_value = {"-create-vdevices", "-d", "-vdevice-compute-units", "-vdevice-memory-size"}
    flags = {"-show-device-info", "-show-vdevice-info", "-destroy-vdevice"}
    i = 0
    while i < len(args):
        a = args[i]
        if a in takes_value:
            if i + 1 >= len(args):
                raise Fail(f"Error: option {a} requires a value", 2)
            opts[a] = args[i + 1]
            i += 2
        elif a in flags:
            opts[a] = True
            i += 1
        else:
            raise Fail(f"Error: unknown option {a!r} for 'hy-smi virtual'", 2)
    present = [d for d in state["devices"] if d.get("present", True)]
    if opts.get("-show-device-info"):
        out = []
        for d in present:
            out.append(
                f"Device {d['index']}:\n Actual Device: {d['index']}\n"
                f" Compute units: {d['compute_units']}\n"
                f" Global memory: {d['memory_mib'] * MIB} bytes"
            )
        return "\n".join(out) + "\n", False
    if opts.get("-show-vdevice-info"):
        if not state["vdevices"]:
            return "No virtual device exists.\n", False
        out = []
        for v in sorted(state["vdevices"], key=lambda v: v["index"]):
            out.append(
                f"Virtual Device {v['index']}:\n Actual Device: {v['device']}\n"
                f" Compute units: {v['compute_units']}\n"
                f" Global memory: {v['memory_mib'] * MIB} bytes"
            )
        return "\n".join(out) + "\n", False
    if "-create-vdevices" in opts:
        if "-d" not in opts:
            raise Fail("Error: -create-vdevices needs -d <device id>", 2)
        d = device(state, str(opts["-d"]))
        n_raw = str(opts["-create-vdevices"])
        if not n_raw.isdigit() or int(n_raw) < 1:
            raise Fail(f"Error: invalid number of virtual devices {n_raw!r}", 2)
        n = int(n_raw)
        cus = int_list(str(opts.get("-vdevice-compute-units", "")), "compute units")
        mems = int_list(str(opts.get("-vdevice-memory-size", "")), "memory size")
        if len(cus) != n or len(mems) != n:
            raise Fail(f"Error: {n} virtual devices need {n} compute-unit and memory values", 2)
        mine = [v for v in state["vdevices"] if v["device"] == d["index"]]
        if len(mine) + n > MAX_VDEVICES:
            raise Fail(
                f"Error: a physical device supports at most {MAX_VDEVICES} virtual devices "
                f"(device {d['index']} has {len(mine)}, {n} requested)"
            )
        if any(c < 1 for c in cus) or any(m < 1 for m in mems):
            raise Fail("Error: compute units and memory size must be positive")
        if sum(c for c in cus) + sum(v["compute_units"] for v in mine) > d["compute_units"]:
            raise Fail(f"Error: not enough compute units on device {d['index']}")
        if sum(mems) + sum(v["memory_mib"] for v in mine) > d["memory_mib"]:
            raise Fail(f"Error: not enough memory on device {d['index']}")
        if mode != "noop":
            used = {v["index"] for v in state["vdevices"]}
            for c, m in zip(cus, mems, strict=True):
                idx = next(k for k in range(1024) if k not in used)
                used.add(idx)
                state["vdevices"].append(
                    {"index": idx, "device": d["index"], "compute_units": c, "memory_mib": m}
                )
        return "The virtual device is created successfully!\n", True
    if opts.get("-destroy-vdevice"):
        targets = [device(state, str(opts["-d"]))["index"]] if "-d" in opts else None
        if mode != "noop":
            state["vdevices"] = [
                v for v in state["vdevices"] if targets is not None and v["device"] not in targets
            ]
        return "The virtual device is destroyed successfully!\n", True
    raise Fail("Error: no operation given to 'hy-smi virtual'", 2)


# -- hy-smi mig (nvidia-smi layout) --------------------------------------------------------------


def mig_profile(d: dict, pid: int) -> dict:
    for p in d.get("mig_profiles", []):
        if p["id"] == pid:
            return p
    raise Fail(
        f"Unable to create a GPU instance on GPU {d['index']} using profile {pid}: Not Found", 6
    )


def cmd_mig(state: dict, args: list[str], mode: str) -> tuple[str, bool]:
    if not state.get("mig"):
        raise Fail("hy-smi: error: argument: invalid choice: 'mig'", 2)
    opts: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-cgi", "-i", "-gi"):
            if i + 1 >= len(args):
                raise Fail(f"Option {a} requires a value", 2)
            opts[a] = args[i + 1]
            i += 2
        elif a in ("-lgip", "-lgipp", "-lgi", "-C", "-dci", "-dgi"):
            opts[a] = True
            i += 1
        else:
            raise Fail(f"Invalid combination of input arguments: {a}", 2)
    devs = [d for d in state["devices"] if d.get("present", True) and d.get("mig_profiles")]
    if "-i" in opts:
        devs = [device(state, str(opts["-i"]))]
    gis = state["gpu_instances"]
    if opts.get("-lgip"):
        if not any(d.get("mig_profiles") for d in devs):
            raise Fail("No MIG-enabled devices found.", 6, stdout="No MIG-enabled devices found.\n")
        bar = "+" + "-" * 77 + "+"
        lines = [
            bar,
            "| GPU instance profiles:" + " " * 54 + "|",
            "| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |",
            "|                              Free/Total   GiB              CE    JPEG  OFA  |",
            "|" + "=" * 77 + "|",
        ]
        for d in devs:
            for p in d.get("mig_profiles", []):
                used = sum(
                    1 for g in gis if g["device"] == d["index"] and g["profile_id"] == p["id"]
                )
                free = max(0, p["max"] - used)
                row = (
                    f"|  {d['index']:2d}  MIG {p['name']:<12} {p['id']:3d}     {free}/{p['max']}"
                    f"        {p['memory_mib'] / 1024:.2f}       No     {p['cus']:<4}   0     0"
                )
                lines += [
                    row.ljust(78) + "|",
                    "|" + " " * 60 + "0     0     0".ljust(17) + "|",
                    bar,
                ]
        return "\n".join(lines) + "\n", False
    if opts.get("-lgipp"):
        lines = []
        for d in devs:
            for p in d.get("mig_profiles", []):
                starts = ",".join(str(s) for s in p["starts"])
                lines.append(
                    f"GPU  {d['index']} Profile ID {p['id']:2d} Placements: {{{starts}}}:{p['slices']}"
                )
        if not lines:
            raise Fail("No MIG-enabled devices found.", 6, stdout="No MIG-enabled devices found.\n")
        return "\n".join(lines) + "\n", False
    if opts.get("-lgi"):
        mine = [g for g in gis if any(g["device"] == d["index"] for d in devs)]
        if not mine:
            raise Fail(
                "No GPU instances found: Not Found", 6, stdout="No GPU instances found: Not Found\n"
            )
        bar = "+" + "-" * 55 + "+"
        lines = [
            bar,
            "| GPU instances:" + " " * 40 + "|",
            "| GPU   Name             Profile  Instance   Placement  |",
            "|                          ID       ID       Start:Size |",
            "|" + "=" * 55 + "|",
        ]
        for g in sorted(mine, key=lambda g: (g["device"], g["gi"])):
            d = device(state, str(g["device"]))
            p = mig_profile(d, g["profile_id"])
            lines.append(
                f"|  {g['device']:2d}  MIG {p['name']:<12} {g['profile_id']:5d}    {g['gi']:5d}"
                f"          {g['start']}:{g['size']}     |"
            )
            lines.append(bar)
        return "\n".join(lines) + "\n", False
    if "-cgi" in opts:
        if "-i" not in opts:
            raise Fail("Option -i is required with -cgi on this fake", 2)
        d = devs[0]
        try:
            pid = int(str(opts["-cgi"]))
        except ValueError:
            raise Fail(f"Invalid profile {opts['-cgi']!r}", 2) from None
        p = mig_profile(d, pid)
        taken = set()
        for g in gis:
            if g["device"] == d["index"]:
                taken.update(range(g["start"], g["start"] + g["size"]))
        start = next((s for s in p["starts"] if not taken & set(range(s, s + p["slices"]))), None)
        if start is None:
            raise Fail(
                f"Unable to create a GPU instance on GPU {d['index']} using profile {pid}: "
                "Insufficient Resources",
                6,
            )
        gi = next(
            k for k in range(1, 64) if all(g["gi"] != k or g["device"] != d["index"] for g in gis)
        )
        if mode != "noop":
            gis.append(
                {
                    "device": d["index"],
                    "gi": gi,
                    "profile_id": pid,
                    "start": start,
                    "size": p["slices"],
                    "ci": bool(opts.get("-C")),
                }
            )
        out = f"Successfully created GPU instance ID {gi:2d} on GPU {d['index']:2d} using profile MIG {p['name']} (ID {pid:2d})\n"
        if opts.get("-C"):
            out += f"Successfully created compute instance ID  0 on GPU {d['index']:2d} GPU instance ID {gi:2d} using profile MIG {p['name']} (ID  0)\n"
        return out, True
    if opts.get("-dci") or opts.get("-dgi"):
        which = [g for g in gis if any(g["device"] == d["index"] for d in devs)]
        if "-gi" in opts:
            which = [g for g in which if str(g["gi"]) == str(opts["-gi"])]
        if not which:
            raise Fail("No GPU instances found: Not Found", 6)
        out = []
        for g in which:
            if opts.get("-dci"):
                if mode != "noop":
                    g["ci"] = False
                out.append(
                    f"Successfully destroyed compute instance ID  0 from GPU {g['device']:2d} GPU instance ID {g['gi']:2d}"
                )
            else:
                if g.get("ci"):
                    raise Fail(
                        f"Unable to destroy GPU instance ID {g['gi']:2d} from GPU {g['device']:2d}: In use by another client",
                        19,
                    )
                if mode != "noop":
                    gis.remove(g)
                out.append(
                    f"Successfully destroyed GPU instance ID {g['gi']:2d} from GPU {g['device']:2d}"
                )
        return "\n".join(out) + "\n", True
    raise Fail("Invalid combination of input arguments. Please run 'hy-smi mig -h' for help.", 2)


# -- rocm-smi style flags ------------------------------------------------------------------

SHOW_FLAGS = (
    "--showproductname",
    "--showuniqueid",
    "--showmeminfo",
    "--showtemp",
    "--showpower",
    "--showuse",
    "--showmemuse",
    "--showmaxpower",
    "--showclocks",
    "--showclkfrq",
)
CONTROL_FLAGS = ("--setsclk", "--resetclocks", "--setpoweroverdrive")


def help_text(state: dict) -> str:
    lines = [
        "usage: hy-smi [-h] [-d DEVICE [DEVICE ...]] [--json] [--showproductname] ...",
        "",
        "DCU System Management Interface (fake)",
        "",
        "  -h, --help            show this help message and exit",
        "  -d DEVICE [DEVICE ...], --device DEVICE [DEVICE ...]  Execute command on specified device",
        "  --json                Print output in JSON format",
        "  virtual               vDCU management (see 'hy-smi virtual -h')",
        "  mig                   Multi-Instance management (see 'hy-smi mig -h')",
    ]
    lines += [f"  {f:<22}Show information" for f in SHOW_FLAGS]
    if state.get("control", True):
        lines += [
            "  --setsclk LEVEL [LEVEL ...]  Set GPU Clock Frequency Level(s) (requires manual Perf level)",
            "  -r, --resetclocks     Reset clocks and OverDrive to default",
            "  --setpoweroverdrive WATTS  Set the maximum GPU power using Power OverDrive in Watts",
        ]
    return "\n".join(lines) + "\n"


def card_fields(d: dict, shows: set[str], mem_types: list[str]) -> dict[str, str]:
    f: dict[str, str] = {}
    if "--showproductname" in shows:
        f["Card Series"] = d["series"]
        f["Card Vendor"] = d["vendor"]
    if "--showuniqueid" in shows:
        f["Unique ID"] = d["unique_id"]
    if "--showmeminfo" in shows:
        for t in mem_types:
            f[f"{t} Total Memory (MiB)"] = str(d["memory_mib"])
            f[f"{t} Total Used Memory (MiB)"] = str(d["mem_used_mib"])
    if "--showtemp" in shows:
        f["Temperature (Sensor edge) (C)"] = f"{d['temperature_c'] - 3:.1f}"
        f["Temperature (Sensor junction) (C)"] = f"{d['temperature_c']:.1f}"
        f["Temperature (Sensor mem) (C)"] = f"{d['temperature_c'] - 5:.1f}"
    if "--showpower" in shows:
        f["Average Graphics Package Power (W)"] = f"{d['power_w']:.1f}"
    if "--showuse" in shows:
        f["DCU use (%)"] = f"{d['use_pct']:.1f}"
    if "--showmemuse" in shows:
        f["DCU memory use (%)"] = f"{100.0 * d['mem_used_mib'] / d['memory_mib']:.0f}"
    if "--showmaxpower" in shows:
        f["Max Graphics Package Power (W)"] = f"{d['max_power_w']:.1f}"
    if "--showclocks" in shows:
        f["sclk clock speed:"] = f"({d['sclk_mhz'][d['sclk_level']]}Mhz)"
        f["sclk clock level:"] = str(d["sclk_level"])
    for name in d.get("hide_fields", []):  # a driver that does not report a field
        f.pop(name, None)
    return f


def cmd_main(state: dict, args: list[str], mode: str) -> tuple[str, bool]:
    if not args or args[0] in ("-h", "--help"):
        return help_text(state), False
    control = state.get("control", True)
    known = (
        set(SHOW_FLAGS)
        | {"--json", "-d", "--device"}
        | (set(CONTROL_FLAGS) | {"-r"} if control else set())
    )
    shows: set[str] = set()
    mem_types: list[str] = []
    dev_ids: list[str] | None = None
    setsclk: list[str] | None = None
    power: str | None = None
    reset = False
    as_json = False
    i = 0
    while i < len(args):
        a = args[i]
        if a not in known:
            raise Fail(f"usage: hy-smi [-h] ...\nhy-smi: error: unrecognized arguments: {a}", 2)
        i += 1
        if a in ("-d", "--device", "--setsclk"):
            values = []
            while i < len(args) and not args[i].startswith("-"):
                values.append(args[i])
                i += 1
            if not values:
                raise Fail(f"hy-smi: error: argument {a}: expected at least one argument", 2)
            if a == "--setsclk":
                setsclk = values
            else:
                dev_ids = values
        elif a == "--showmeminfo":
            while i < len(args) and not args[i].startswith("-"):
                if args[i] not in ("vram", "vis_vram", "gtt"):
                    raise Fail(
                        f"hy-smi: error: argument --showmeminfo: invalid choice: {args[i]!r}", 2
                    )
                mem_types.append(args[i])
                i += 1
            shows.add(a)
        elif a == "--setpoweroverdrive":
            if i >= len(args):
                raise Fail("hy-smi: error: argument --setpoweroverdrive: expected one argument", 2)
            power = args[i]
            i += 1
        elif a in ("--resetclocks", "-r"):
            reset = True
        elif a == "--json":
            as_json = True
        else:
            shows.add(a)
    devs = [d for d in state["devices"] if d.get("present", True)]
    if dev_ids is not None:
        devs = [device(state, x) for x in dev_ids]
    if setsclk is not None or power is not None or reset:
        if dev_ids is None:
            raise Fail("hy-smi: error: a setter needs -d DEVICE on this fake", 2)
        out = []
        for d in devs:
            if setsclk is not None:
                levels = []
                for lv in setsclk:
                    if not lv.isdigit() or int(lv) >= len(d["sclk_mhz"]):
                        raise Fail(f"DCU[{d['index']}]\t\t: Invalid clock level {lv!r}")
                    levels.append(int(lv))
                if mode != "noop":
                    d["sclk_level"] = max(levels)
                out.append(f"DCU[{d['index']}]\t\t: Successfully set sclk bitmask to {setsclk}")
            if reset:
                if mode != "noop":
                    d["sclk_level"] = len(d["sclk_mhz"]) - 1
                out.append(f"DCU[{d['index']}]\t\t: Successfully reset clocks")
            if power is not None:
                lo, hi = d["power_range_w"]
                if not power.isdigit() or not lo <= int(power) <= hi:
                    raise Fail(
                        f"DCU[{d['index']}]\t\t: Unable to set power cap to {power}W (range {lo}-{hi}W)"
                    )
                if mode != "noop":
                    d["max_power_w"] = float(power)
                out.append(f"DCU[{d['index']}]\t\t: Successfully set power to: {power}W")
        return "\n".join(out) + "\n", True
    if not shows:
        raise Fail("hy-smi: error: nothing to show", 2)
    label = state.get("label", "DCU")
    if as_json:
        payload = {f"card{d['index']}": card_fields(d, shows, mem_types or ["vram"]) for d in devs}
        return json.dumps(payload) + "\n", False
    lines = ["=" * 24 + " System Management Interface " + "=" * 24]
    for d in devs:
        if "--showclkfrq" in shows:
            lines.append(
                f"{label}[{d['index']}]\t\t: Supported sclk frequencies on {label}{d['index']}"
            )
            for lvl, mhz in enumerate(d["sclk_mhz"]):
                star = " *" if lvl == d["sclk_level"] else ""
                lines.append(f"{label}[{d['index']}]\t\t: {lvl}: {mhz}Mhz{star}")
            lines.append(f"{label}[{d['index']}]\t\t: ")
        for k, v in card_fields(d, shows - {"--showclkfrq"}, mem_types or ["vram"]).items():
            lines.append(f"{label}[{d['index']}]\t\t: {k}: {v}")
    lines.append("=" * 30 + " End of SMI Log " + "=" * 30)
    return "\n".join(lines) + "\n", False


GARBAGE = (
    "\x1b[31mSegmentation fault in libhydmi.so\x1b[0m {{{ card0: <<not json>> \n"
    + "GARBAGE-0xDEADBEEF " * 60
)


def main(argv: list[str]) -> int:
    log = os.environ.get("FAKE_HY_SMI_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(argv) + "\n")
    state_path = os.environ.get("FAKE_HY_SMI_STATE")
    if not state_path:
        sys.stderr.write("fake hy-smi: FAKE_HY_SMI_STATE is not set\n")
        return 70
    mode = os.environ.get("FAKE_HY_SMI_MODE", "")
    if mode == "garbage":
        sys.stdout.write(GARBAGE)
        return 0
    if mode == "fail":
        sys.stderr.write("hy-smi: error: failed to initialize DMI: driver not loaded (simulated)\n")
        return 1
    state = load(state_path)
    try:
        if argv and argv[0] == "virtual" and not state.get("virtual", True):
            raise Fail("hy-smi: error: argument: invalid choice: 'virtual'", 2)
        if argv and argv[0] == "virtual":
            out, changed = cmd_virtual(state, argv[1:], mode)
        elif argv and argv[0] == "mig":
            out, changed = cmd_mig(state, argv[1:], mode)
        else:
            out, changed = cmd_main(state, argv, mode)
    except Fail as exc:
        sys.stdout.write(exc.stdout)
        sys.stderr.write(str(exc) + "\n")
        return exc.status
    if changed:
        save(state_path, state)
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
