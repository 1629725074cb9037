"""One shard as the server runs it: the verified ONNX file in onnxruntime, and the checks
a ModelInfer request must pass against its manifest before it runs."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from gpuflow.tasks.edge.manifest import ManifestError, ShardManifest, TensorSpec, verify_shard
from gpuflow.tasks.edge.serving.codec import TensorCodecError, decode_tensors
from gpuflow.tasks.edge.serving.proto import oip as pb
from gpuflow.tasks.edge.serving.shm import RegionRegistry, TensorLayout

# onnxruntime's type strings for the datatypes a manifest can declare.
_ORT_TO_KSERVE = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
}


def cpu_quota_threads(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may use: its affinity, capped by a cgroup v2 CPU quota (what
    ``docker run --cpus`` and Kubernetes' CPU limits set), rounded up."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    try:
        return max(1, min(cores, math.ceil(int(quota) / int(period))))
    except (ValueError, ZeroDivisionError):
        return cores


class InvalidRequestError(ValueError):
    """A ModelInfer request this shard cannot run as sent (-> INVALID_ARGUMENT)."""


class ModelNotFoundError(InvalidRequestError):
    """A request for a model or version this shard does not serve (-> NOT_FOUND, as Triton)."""


def _check_against_session(
    manifest: ShardManifest, what: str, specs: list[TensorSpec], args: Sequence[ort.NodeArg]
) -> None:
    """Refuse a manifest that disagrees with the ONNX file about names, dtypes or ranks."""
    onnx_args = {a.name: a for a in args}
    for spec in specs:
        arg = onnx_args.get(spec.name)
        if arg is None:
            raise ManifestError(
                f"shard {manifest.model_name}: manifest {what} {spec.name!r} is not a graph "
                f"{what} of {manifest.onnx_file} (graph has {sorted(onnx_args)})"
            )
        onnx_dtype = _ORT_TO_KSERVE.get(arg.type, arg.type)
        if onnx_dtype != spec.dtype:
            raise ManifestError(
                f"shard {manifest.model_name}: {what} {spec.name!r} is {spec.dtype} in the "
                f"manifest but {onnx_dtype} in the ONNX file"
            )
        if arg.shape is not None and len(arg.shape) != len(spec.shape):
            raise ManifestError(
                f"shard {manifest.model_name}: {what} {spec.name!r} has rank {len(spec.shape)} "
                f"in the manifest but {len(arg.shape)} in the ONNX file"
            )


def served_session_options(intra_op_threads: int = 0) -> ort.SessionOptions:
    """The onnxruntime session a shard is served in: full graph optimisation (onnxruntime's
    default), ``intra_op_threads`` (0: as many as this process may really use, not every
    core of the host: a container limited to 2 CPUs on a 64-core node would otherwise spin
    64 threads). The planner times shards in this same session (served_profile.py), so a
    predicted stage is what the server will take."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(intra_op_threads) or cpu_quota_threads()
    options.log_severity_level = 3  # errors only: per-run warnings would flood the log
    return options


class ShardModel:
    """A verified shard loaded into onnxruntime, with the request checks of its manifest."""

    def __init__(
        self, shard_dir: str | Path, intra_op_threads: int = 0, providers: Sequence[str] = ()
    ) -> None:
        self.shard_dir = Path(shard_dir)
        # verify_shard raises ShardIntegrityError before any byte of the model is parsed.
        self.manifest = verify_shard(self.shard_dir)
        options = served_session_options(intra_op_threads)
        available = ort.get_available_providers()
        chosen = [p for p in providers if p in available] or ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(
                str(self.shard_dir / self.manifest.onnx_file), options, providers=chosen
            )
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ManifestError(
                f"shard {self.manifest.model_name}: onnxruntime cannot load "
                f"{self.manifest.onnx_file}: {exc}"
            ) from None
        _check_against_session(
            self.manifest, "input", self.manifest.inputs, self.session.get_inputs()
        )
        _check_against_session(
            self.manifest, "output", self.manifest.outputs, self.session.get_outputs()
        )
        missing = {a.name for a in self.session.get_inputs()} - {
            s.name for s in self.manifest.inputs
        }
        if missing:
            raise ManifestError(
                f"shard {self.manifest.model_name}: graph inputs {sorted(missing)} are missing "
                "from the manifest"
            )
        self.inputs = {s.name: s for s in self.manifest.inputs}
        self.outputs = {s.name: s for s in self.manifest.outputs}
        self.providers = self.session.get_providers()
        # The outputs' dtypes and shapes each input signature gave when it last ran (False:
        # they changed, so the graph's shapes depend on the data): what lets a forwarding
        # shard have onnxruntime write its outputs into the next hop's slot. Learnt only
        # where asked (a forwarding shard), for at most _MAX_LAYOUTS signatures.
        self._layouts: dict[tuple, list[TensorLayout] | bool] = {}

    @property
    def name(self) -> str:
        return self.manifest.model_name

    @property
    def version(self) -> str:
        return self.manifest.version

    def serves(self, name: str, version: str = "") -> bool:
        return name == self.name and version in ("", self.version)

    def _check_model(self, request: pb.ModelInferRequest) -> None:
        if request.model_name != self.name:
            raise ModelNotFoundError(
                f"model {request.model_name!r} is not served here; this server serves {self.name!r}"
            )
        if request.model_version not in ("", self.version):
            have = repr(self.version) if self.version else "none (leave it empty)"
            raise ModelNotFoundError(
                f"model {self.name!r} has no version {request.model_version!r}; version: {have}"
            )

    def decode_inputs(
        self, request: pb.ModelInferRequest, regions: RegionRegistry | None = None
    ) -> dict[str, np.ndarray]:
        """The request's input arrays, every check done first; InvalidRequestError naming
        the first problem otherwise. Inputs in shared memory are read from ``regions``."""
        self._check_model(request)
        seen: set[str] = set()
        for tensor in request.inputs:
            spec = self.inputs.get(tensor.name)
            if spec is None:
                raise InvalidRequestError(
                    f"model {self.name!r} has no input {tensor.name!r}; inputs: "
                    f"{sorted(self.inputs)}"
                )
            if tensor.name in seen:
                raise InvalidRequestError(f"input {tensor.name!r} is given twice")
            seen.add(tensor.name)
            if tensor.datatype != spec.dtype:
                raise InvalidRequestError(
                    f"input {tensor.name!r}: datatype {tensor.datatype!r} but model "
                    f"{self.name!r} expects {spec.dtype}"
                )
            shape = list(tensor.shape)
            if len(shape) != len(spec.shape) or any(
                want not in (-1, got) or got < 0
                for want, got in zip(spec.shape, shape, strict=True)
            ):
                raise InvalidRequestError(
                    f"input {tensor.name!r}: shape {shape} does not match model {self.name!r}'s "
                    f"{list(spec.shape)} (-1 = any size)"
                )
        missing = sorted(set(self.inputs) - seen)
        if missing:
            raise InvalidRequestError(f"model {self.name!r}: inputs {missing} are missing")
        try:
            return decode_tensors(request.inputs, request.raw_input_contents, regions)
        except TensorCodecError as exc:
            raise InvalidRequestError(str(exc)) from None

    def requested_outputs(self, request: pb.ModelInferRequest) -> list[str]:
        names = [o.name for o in request.outputs]
        unknown = sorted(set(names) - set(self.outputs))
        if unknown:
            raise InvalidRequestError(
                f"model {self.name!r} has no outputs {unknown}; outputs: {sorted(self.outputs)}"
            )
        if len(set(names)) != len(names):
            raise InvalidRequestError(f"requested outputs {names} repeat a name")
        return names or list(self.outputs)

    def run(
        self,
        inputs: dict[str, np.ndarray],
        output_names: Sequence[str],
        into: Sequence[np.ndarray] | None = None,
        learn_layout: bool = False,
    ) -> dict[str, np.ndarray]:
        """Run the shard; onnxruntime's InferenceSession.run is safe from many threads.
        ``into``: arrays (of ``output_layout``'s dtypes and shapes) onnxruntime writes the
        outputs into, through an IOBinding, instead of arrays of its own; where that fails
        (shapes that depend on the data) the signature is not bound again and the shard
        runs as usual. ``learn_layout``: remember the outputs' layout for ``output_layout``
        (a shard that forwards; any other has no use for it)."""
        if into is None and not learn_layout:
            results = self.session.run(list(output_names), inputs)
            return dict(zip(output_names, results, strict=True))
        key = (_signature(inputs), tuple(output_names))
        if into is not None:
            try:
                binding = self.session.io_binding()
                for name, array in inputs.items():
                    binding.bind_cpu_input(name, np.ascontiguousarray(array))
                for name, out in zip(output_names, into, strict=True):
                    binding.bind_output(name, "cpu", 0, out.dtype, out.shape, out.ctypes.data)
                self.session.run_with_iobinding(binding)
                return dict(zip(output_names, into, strict=True))
            except Exception:  # noqa: BLE001 - onnxruntime raises untyped errors; run again
                self._layouts[key] = False
        results = self.session.run(list(output_names), inputs)
        known = self._layouts.get(key)
        if known is not False and (known is not None or len(self._layouts) < _MAX_LAYOUTS):
            layout = [(r.dtype, tuple(r.shape)) for r in results]
            if self._layouts.setdefault(key, layout) != layout:
                self._layouts[key] = False
        return dict(zip(output_names, results, strict=True))

    def output_layout(
        self, inputs: dict[str, np.ndarray], output_names: Sequence[str]
    ) -> list[TensorLayout] | None:
        """The dtypes and shapes these outputs had when inputs of this signature last ran,
        if they were the same every time; None before the first run."""
        layout = self._layouts.get((_signature(inputs), tuple(output_names)))
        return layout if isinstance(layout, list) else None


# Input signatures whose output layouts a shard keeps: a few batch sizes in practice; a
# shard fed ever new shapes stops learning there (those requests are copied, as before).
_MAX_LAYOUTS = 64


def _signature(inputs: dict[str, np.ndarray]) -> tuple:
    return tuple((name, a.dtype.str, a.shape) for name, a in inputs.items())
