"""The shard manifest: what one packaged shard is, where it sits in the chain, and its checksum.

A packaged shard is a folder holding ``model.onnx`` and ``manifest.json``. The manifest names
the Open Inference Protocol (KServe v2) model the shard serves, its inputs and outputs with
shapes (``-1`` = variable, as in KServe) and KServe datatype strings ("FP32", "INT64", ...),
its position in the chain and the next hop a forwarding server sends its outputs to. The
sha256 of the ONNX file is recorded so a server can refuse a shard that was altered or
truncated on the way to its node (``verify_shard``).

The serving code (tasks/edge/serving) reads this module; keep its API stable.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1

# KServe v2 / Open Inference Protocol datatype strings and their numpy counterparts.
KSERVE_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
NUMPY_TO_KSERVE: dict[np.dtype, str] = {v: k for k, v in KSERVE_TO_NUMPY.items()}

_HOP_RE = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:(\d{1,5})$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


class ManifestError(ValueError):
    """A manifest that is missing, unreadable or inconsistent."""


class ShardIntegrityError(ManifestError):
    """The shard's ONNX file does not match the sha256 its manifest records."""


def kserve_dtype(dtype: Any) -> str:
    """The KServe datatype string of a numpy dtype (or dtype-like); ValueError if none."""
    np_dtype = np.dtype(dtype)
    try:
        return NUMPY_TO_KSERVE[np_dtype]
    except KeyError:
        raise ValueError(f"no KServe datatype for numpy dtype {np_dtype}") from None


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a KServe datatype string ("FP32" -> float32); ValueError if unknown."""
    try:
        return KSERVE_TO_NUMPY[datatype]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown KServe datatype {datatype!r}; known: {', '.join(KSERVE_TO_NUMPY)}"
        ) from None


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: ONNX tensor name, shape (-1 for a variable dim), KServe datatype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ManifestError(f"tensor name must be a non-empty string, got {self.name!r}")
        shape = tuple(self.shape)
        if any(not isinstance(d, int) or isinstance(d, bool) or d < -1 for d in shape):
            raise ManifestError(
                f"tensor {self.name!r}: shape must be ints >= -1 (-1 = variable), got {shape!r}"
            )
        object.__setattr__(self, "shape", shape)
        numpy_dtype(self.dtype)  # raises on an unknown datatype

    @property
    def numpy_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype)

    def matches(self, array: np.ndarray) -> bool:
        """True when the array's dtype and shape fit this spec (-1 dims match any size)."""
        if array.dtype != self.numpy_dtype or array.ndim != len(self.shape):
            return False
        return all(want in (-1, got) for want, got in zip(self.shape, array.shape, strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
        try:
            return cls(name=data["name"], shape=tuple(data["shape"]), dtype=data["dtype"])
        except (KeyError, TypeError) as exc:
            raise ManifestError(f"bad tensor entry {data!r}: {exc}") from None


@dataclass(frozen=True)
class ShardManifest:
    """What one shard is and where it sits in the chain (shard_index counts from 0).

    ``model_name`` is the OIP model name the shard is served under; ``next_hop`` ("host:port")
    is where a forwarding server sends this shard's outputs, None for the last shard or for a
    chain run by a driver. ``source_model``, ``opset``, ``version`` and ``cost_ms`` are
    informational (what it was cut from, the ONNX opset, the deployment version, the
    profiled cost of its nodes).
    """

    model_name: str
    shard_index: int
    num_shards: int
    onnx_file: str
    sha256: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    next_hop: str | None = None
    source_model: str = ""
    opset: int | None = None
    version: str = ""
    cost_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.model_name, str) or not _NAME_RE.match(self.model_name):
            raise ManifestError(f"model_name must match [A-Za-z0-9_.-]+, got {self.model_name!r}")
        if not isinstance(self.num_shards, int) or self.num_shards < 1:
            raise ManifestError(f"num_shards must be a positive int, got {self.num_shards!r}")
        if not isinstance(self.shard_index, int) or not 0 <= self.shard_index < self.num_shards:
            raise ManifestError(
                f"shard_index must be in [0, {self.num_shards}), got {self.shard_index!r}"
            )
        if not isinstance(self.onnx_file, str) or Path(self.onnx_file).name != self.onnx_file:
            raise ManifestError(
                f"onnx_file must be a bare file name in the shard folder, got {self.onnx_file!r}"
            )
        if not isinstance(self.sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ManifestError(f"sha256 must be 64 lowercase hex digits, got {self.sha256!r}")
        if not self.inputs or not self.outputs:
            raise ManifestError("a shard needs at least one input and one output")
        object.__setattr__(self, "inputs", [_spec(t) for t in self.inputs])
        object.__setattr__(self, "outputs", [_spec(t) for t in self.outputs])
        if self.next_hop is not None:
            parse_hop(self.next_hop)

    @property
    def is_last(self) -> bool:
        return self.shard_index == self.num_shards - 1

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["inputs"] = [t.to_dict() for t in self.inputs]
        data["outputs"] = [t.to_dict() for t in self.outputs]
        data["manifest_version"] = MANIFEST_VERSION
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardManifest:
        data = dict(data)
        data.pop("manifest_version", None)
        try:
            data["inputs"] = [TensorSpec.from_dict(t) for t in data["inputs"]]
            data["outputs"] = [TensorSpec.from_dict(t) for t in data["outputs"]]
            return cls(**data)
        except (KeyError, TypeError) as exc:
            raise ManifestError(f"bad manifest: {exc}") from None


def _spec(value: TensorSpec | dict[str, Any]) -> TensorSpec:
    return value if isinstance(value, TensorSpec) else TensorSpec.from_dict(value)


def parse_hop(hop: str) -> tuple[str, int]:
    """Split "host:port" into (host, port); ManifestError naming the bad value otherwise."""
    match = _HOP_RE.match(hop) if isinstance(hop, str) else None
    port = int(match.group(1)) if match else 0
    if not match or not 1 <= port <= 65535:
        raise ManifestError(f"next hop must be 'host:port' with port 1-65535, got {hop!r}")
    return hop.rsplit(":", 1)[0], port


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in chunks (shards can be hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save_manifest(manifest: ShardManifest, shard_dir: str | Path) -> Path:
    """Write ``manifest.json`` into the shard folder; returns its path."""
    path = Path(shard_dir) / MANIFEST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")
    tmp.replace(path)  # atomic: a server never reads a half-written manifest
    return path


def load_manifest(shard_dir: str | Path) -> ShardManifest:
    """Read ``manifest.json`` from a shard folder; ManifestError if missing or malformed."""
    path = Path(shard_dir) / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(f"no {MANIFEST_FILE} in shard folder {Path(shard_dir)}")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a JSON object")
    return ShardManifest.from_dict(data)


def verify_shard(shard_dir: str | Path) -> ShardManifest:
    """Load the manifest and check the ONNX file's sha256; ShardIntegrityError on mismatch."""
    manifest = load_manifest(shard_dir)
    onnx_path = Path(shard_dir) / manifest.onnx_file
    if not onnx_path.is_file():
        raise ShardIntegrityError(
            f"shard {manifest.model_name}: ONNX file {onnx_path} named by the manifest is missing"
        )
    actual = file_sha256(onnx_path)
    if actual != manifest.sha256:
        raise ShardIntegrityError(
            f"shard {manifest.model_name}: sha256 mismatch for {onnx_path}: manifest says "
            f"{manifest.sha256}, file has {actual}; refusing to serve an altered shard"
        )
    return manifest
