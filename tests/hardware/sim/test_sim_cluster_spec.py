from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.sim import ClusterSpec, load_cluster_spec
from gpuflow.hardware.sim.cluster_spec import ClusterSpecError

GOOD = {
    "name": "t",
    "seed": 1,
    "nodes": [
        {"name": "n0", "region": "r", "role": "active", "devices": [{"sku": "h100", "count": 2}]},
        {
            "name": "n1",
            "region": "r",
            "role": "spare",
            "devices": [{"sku": "NVIDIA H200", "count": 1}],
        },
    ],
}


def test_default_fleet_is_mixed_and_has_a_spare() -> None:
    spec = load_cluster_spec(None)
    assert isinstance(spec, ClusterSpec)
    slots = spec.device_slots()
    assert len(slots) == 18
    assert len({s.name for _, _, s in slots}) >= 3
    assert {s.vendor for _, _, s in slots} == {"NVIDIA", "Hygon"}
    assert len({n.region for n in spec.nodes}) == 2
    assert [n.role for n in spec.nodes].count("spare") == 1


def test_aliases_resolve_to_full_names(write_spec: Callable[..., Path]) -> None:
    spec = load_cluster_spec(write_spec(GOOD))
    assert spec.node("n0").device_skus() == ["NVIDIA H100 80GB HBM3"] * 2
    assert spec.faults.natural is True
    assert spec.to_dict() == ClusterSpec.from_dict(spec.to_dict()).to_dict()


def _mutate(path: str, value: object) -> dict:
    data = copy.deepcopy(GOOD)
    target: object = data
    keys = path.split(".")
    for k in keys[:-1]:
        target = target[int(k)] if k.isdigit() else target[k]  # type: ignore[index]
    last = keys[-1]
    if value is KeyError:
        del target[last]  # type: ignore[union-attr]
    else:
        target[int(last) if last.isdigit() else last] = value  # type: ignore[index]
    return data


@pytest.mark.parametrize(
    ("data", "needles"),
    [
        (
            _mutate("nodes.0.devices.0.sku", "a200"),
            ["node 'n0'", "devices[0].sku", "unknown SKU 'a200'"],
        ),
        (_mutate("nodes.1.name", "n0"), ["nodes[1]", "'n0'", "duplicate node name"]),
        (_mutate("nodes.0.role", "backup"), ["node 'n0'", "role", "'backup'"]),
        (_mutate("nodes.0.devices.0.count", 0), ["node 'n0'", "devices[0].count", ">= 1"]),
        (_mutate("nodes.0.devices.0.count", "2"), ["devices[0].count"]),
        (_mutate("nodes.0.devices", []), ["node 'n0'", "devices"]),
        (_mutate("nodes.0.region", KeyError), ["node 'n0'", "region"]),
        (_mutate("nodes.0.ambient_c", 200), ["node 'n0'", "ambient_c"]),
        (_mutate("nodes.0.gpus", 2), ["node 'n0'", "unknown key", "gpus"]),
        (_mutate("nodes", []), ["nodes", "non-empty"]),
        (_mutate("seed", "x"), ["seed", "integer"]),
        (_mutate("faults", {"abrupt_share": 0.9}), ["faults", "abrupt_share"]),
        (_mutate("faults", {"natural": "yes"}), ["faults.natural"]),
        (_mutate("faults", {"lemon_factor": -1}), ["faults.lemon_factor"]),
        ("nodes: [", ["not valid YAML"]),
        ("- 1\n- 2\n", ["top level", "mapping"]),
    ],
)
def test_bad_specs_name_the_field(
    write_spec: Callable[..., Path], data: object, needles: list[str]
) -> None:
    path = write_spec(data)
    with pytest.raises(ClusterSpecError) as e:
        load_cluster_spec(path)
    msg = str(e.value)
    assert str(path) in msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    assert isinstance(e.value, InvalidRequestError)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterSpecError, match="cannot read"):
        load_cluster_spec(tmp_path / "nope.yaml")
