"""torch -> ONNX with the dynamo exporter, for the project's ResNets and Llama-style decoders.

``export_model`` builds a named model from the registry (seeded, eval mode), exports it with
``torch.onnx.export(..., dynamo=True)``, runs ONNX shape inference over the result so every
intermediate tensor (the future cut tensors) has a shape and dtype in ``value_info`` (what
``onnx.utils.extract_model`` needs), and records the opset. The batch dimension is exported
as dynamic, so one shard serves any batch size; a decoder's sequence length stays static,
which lets the exporter fold the rotary tables and the causal mask into constants (otherwise
they would be computed from the input's shape and stay live across every layer, leaving no
single-tensor cut between decoder blocks).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import onnx
import torch
from gpuflow.tasks.training.models.registry import build_model, model_spec
from torch import nn

DEFAULT_OPSET = 18
INPUT_NAME = "input"
OUTPUT_NAME = "output"
EXPORT_INFO_FILE = "export.json"


class ExportError(RuntimeError):
    """The model could not be exported (or re-checked) as ONNX."""


@dataclass(frozen=True)
class ExportedModel:
    """An exported model on disk and what it was made from."""

    model_name: str
    onnx_path: Path
    opset: int
    input_name: str
    output_name: str
    input_shape: tuple[int, ...]  # one example batch (batch 1), as exported
    input_dtype: str  # numpy dtype name
    seed: int
    torch_version: str

    def to_dict(self) -> dict:
        data = asdict(self)
        data["onnx_path"] = str(self.onnx_path)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ExportedModel:
        names = {f.name for f in fields(cls)}
        data = {key: value for key, value in data.items() if key in names}
        data["onnx_path"] = Path(data["onnx_path"])
        data["input_shape"] = tuple(data["input_shape"])
        return cls(**data)

    @classmethod
    def load(cls, out_dir: str | Path) -> ExportedModel:
        """The export described by ``out_dir/export.json`` (written by export_model)."""
        path = Path(out_dir) / EXPORT_INFO_FILE
        if not path.is_file():
            raise ExportError(f"no {EXPORT_INFO_FILE} in {out_dir}")
        return cls.from_dict(json.loads(path.read_text()))

    def sample_inputs(self, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
        """Deterministic example inputs for this model (images: normal noise; LMs: token ids)."""
        rng = np.random.default_rng(seed)
        shape = (batch, *self.input_shape[1:])
        if np.dtype(self.input_dtype).kind in "iu":
            vocab = model_spec(self.model_name).vocab_size or 2
            return {self.input_name: rng.integers(0, vocab, size=shape).astype(self.input_dtype)}
        return {self.input_name: rng.standard_normal(shape).astype(self.input_dtype)}


def example_input(model_name: str, batch: int = 1) -> torch.Tensor:
    """A deterministic example input tensor for a registry model (batch first)."""
    spec = model_spec(model_name)
    generator = torch.Generator().manual_seed(0)
    if spec.task == "lm":
        vocab = spec.vocab_size or 2
        return torch.randint(0, vocab, (batch, *spec.input_shape), generator=generator)
    return torch.randn((batch, *spec.input_shape), generator=generator)


def _quiet_export(model: nn.Module, args: tuple, **kwargs: object) -> onnx.ModelProto:
    """Run the dynamo exporter with its progress prints and registration warnings silenced."""
    logger = logging.getLogger("torch.onnx")
    old_level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, args, dynamo=True, verbose=False, **kwargs)
    except Exception as exc:  # the exporter raises many types; name the model in one error
        raise ExportError(f"torch.onnx.export (dynamo) failed: {exc}") from exc
    finally:
        logger.setLevel(old_level)
    if program is None:
        raise ExportError("torch.onnx.export returned no program")
    return program.model_proto


def export_module(
    model: nn.Module,
    example: torch.Tensor,
    onnx_path: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    dynamic_batch: bool = True,
) -> int:
    """Export an nn.Module (eval mode) with one input to ``onnx_path``; returns the opset used.

    Shape inference runs on the result and the model is checked with onnx.checker.
    """
    model = model.eval()
    dynamic_shapes = None
    if dynamic_batch:
        dynamic_shapes = ({0: torch.export.Dim("batch", min=1, max=4096)},)
    with torch.no_grad():
        proto = _quiet_export(
            model,
            (example,),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            opset_version=opset,
            dynamic_shapes=dynamic_shapes,
            external_data=False,
        )
    proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True, data_prop=True)
    onnx.checker.check_model(proto)
    path = Path(onnx_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, str(path))
    return model_opset(proto)


def model_opset(model: onnx.ModelProto) -> int:
    """The default-domain opset an ONNX model was exported at."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise ExportError("ONNX model imports no default-domain opset")


CALIBRATION_BATCHES = 4
CALIBRATION_BATCH_SIZE = 4


def build_for_export(model_name: str, *, seed: int = 0, overrides: dict | None = None) -> nn.Module:
    """The registry model in eval mode, its BatchNorm statistics calibrated (see below).

    An untrained ResNet keeps identity BatchNorm statistics (mean 0, variance 1), so its
    activations grow with depth: ResNet-152's logits reach ~1e8, where float32 rounding
    alone exceeds the chain check's 1e-4. Running a few seeded random batches through the
    model in train mode (cumulative averages, no gradients) sets the statistics the way
    training would, so every layer sees unit-scale activations as in a trained network.
    Models without BatchNorm (the decoders) are unchanged.
    """
    model = build_model(model_name, seed=seed, **(overrides or {}))
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        spec = model_spec(model_name)
        generator = torch.Generator().manual_seed(seed + 1)
        saved = [bn.momentum for bn in norms]
        for bn in norms:
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average over the calibration batches
        model.train()
        with torch.no_grad():
            for _ in range(CALIBRATION_BATCHES):
                shape = (CALIBRATION_BATCH_SIZE, *spec.input_shape)
                model(torch.randn(shape, generator=generator))
        for bn, momentum in zip(norms, saved, strict=True):
            bn.momentum = momentum
    return model.eval()


def export_model(
    model_name: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    opset: int = DEFAULT_OPSET,
    overrides: dict | None = None,
) -> ExportedModel:
    """Build registry model ``model_name`` (seeded) and export it to ``out_dir/<name>.onnx``.

    ``overrides`` are registry settings (``width=16``, ``n_layers=2``) for a smaller variant.
    Also writes ``out_dir/export.json`` describing the export.
    """
    spec = model_spec(model_name)
    model = build_for_export(model_name, seed=seed, overrides=overrides)
    example = example_input(model_name)
    out_dir = Path(out_dir)
    onnx_path = out_dir / f"{model_name}.onnx"
    # A decoder keeps a static sequence length (see module docstring); its batch stays dynamic.
    used_opset = export_module(model, example, onnx_path, opset=opset, dynamic_batch=True)
    exported = ExportedModel(
        model_name=model_name,
        onnx_path=onnx_path,
        opset=used_opset,
        input_name=INPUT_NAME,
        output_name=OUTPUT_NAME,
        input_shape=tuple(example.shape),
        input_dtype=str(example.numpy().dtype),
        seed=seed,
        torch_version=torch.__version__,
    )
    info = exported.to_dict() | {"family": spec.family, "overrides": overrides or {}}
    (out_dir / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return exported


def _cache_key(model_name: str, seed: int, opset: int, overrides: dict | None) -> str:
    blob = json.dumps(
        [
            model_name,
            seed,
            opset,
            overrides or {},
            torch.__version__,
            onnx.__version__,
            "bn-calibrated",
            CALIBRATION_BATCHES,
            CALIBRATION_BATCH_SIZE,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def cached_export(
    model_name: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    opset: int = DEFAULT_OPSET,
    overrides: dict | None = None,
) -> ExportedModel:
    """export_model, reusing an earlier export of the same model, seed, opset and versions.

    Exports are kept under GPUFLOW_HOME/cache/edge-exports; a redeploy of an unchanged model
    skips the exporter (seconds for a small ResNet, a minute for ResNet-152). The files are
    hard-linked into ``out_dir`` (copied across file systems).
    """
    from gpuflow.hardware.home import gpuflow_home

    cache = (
        gpuflow_home() / "cache" / "edge-exports" / _cache_key(model_name, seed, opset, overrides)
    )
    if not (cache / EXPORT_INFO_FILE).is_file():
        tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        export_model(model_name, tmp, seed=seed, opset=opset, overrides=overrides)
        shutil.rmtree(cache, ignore_errors=True)
        tmp.rename(cache)  # atomic: a half-written export is never found in the cache
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in cache.iterdir():
        target = out_dir / item.name
        target.unlink(missing_ok=True)
        try:
            os.link(item, target)
        except OSError:
            shutil.copy2(item, target)
    info = json.loads((out_dir / EXPORT_INFO_FILE).read_text())
    info["onnx_path"] = str(out_dir / f"{model_name}.onnx")
    (out_dir / EXPORT_INFO_FILE).unlink()  # a hard link: rewrite without touching the cache
    (out_dir / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return ExportedModel.from_dict(info)


def torch_reference(
    model_name: str, inputs: np.ndarray, *, seed: int = 0, overrides: dict | None = None
) -> np.ndarray:
    """The torch model's own output for ``inputs`` (to check the export's fidelity)."""
    model = build_for_export(model_name, seed=seed, overrides=overrides)
    with torch.no_grad():
        return model(torch.from_numpy(inputs)).numpy()


# --- Prefect task ---------------------------------------------------------------------------
from prefect import task  # noqa: E402  (thin wrapper kept at the bottom, as in tasks/training)
from prefect.cache_policies import NONE  # noqa: E402

export_task = task(cached_export, name="edge-export", retries=1, cache_policy=NONE)
