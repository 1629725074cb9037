"""What a placement becomes for the job that runs on it.

On a host: the variables that make the runtime see exactly the leased units -
CUDA_VISIBLE_DEVICES with GPU or MIG UUIDs (CUDA accepts ``MIG-<uuid>`` there; one MIG
instance per process is what CUDA enumerates), HIP_VISIBLE_DEVICES with DCU indexes for
Hygon (ROCm's variable) - and the torch device to use. A Hygon vDCU or MIG instance is
confined by a file the DTK/hyhal runtime reads, not by a variable
(``gpuflow.hardware.hygon.confine`` has the sources): the environment names the card
(HIP_VISIBLE_DEVICES), the partition (GPUFLOW_VDCU_ID) and the files the launcher must make
visible (GPUFLOW_VDCU_CONF at GPUFLOW_VDCU_RUNTIME_PATH for a vDCU, GPUFLOW_DCU_MIG_CONF
for MIG).

On Kubernetes (a Prefect Kubernetes work pool): job variables with the extended resource
names the device plugins register - ``nvidia.com/gpu``, ``nvidia.com/mig-<profile>``
(the plugin's "mixed" MIG strategy); for Hygon, by default the names of Hygon's own device
plugin: ``hygon.com/dcu`` (whole), ``hygon.com/dcu-share-<CUs>c-<GiB>g`` (a vDCU gpuflow
carved with hy-smi beforehand) and ``hygon.com/dcu-mig-<profile>``; with
``GPUFLOW_HYGON_DEVICE_PLUGIN=hami`` (vDCUs carved at pod start by HAMi, or by Hygon's
plugin in its ``hami`` strategy) HAMi's ``hygon.com/dcunum`` with ``hygon.com/dcumem``
(MiB) and ``hygon.com/dcucores`` (percent of the card's cores) - and a node selector:
``nvidia.com/gpu.product`` (the label GPU feature discovery sets: the product name with
spaces as dashes) for NVIDIA, HAMi's ``hygon.com/use-dcutype`` annotation for Hygon, and
the node itself when the placement is on one node. The work pool's base job template must
reference ``{{ resources }}``, ``{{ node_selector }}`` and ``{{ pod_annotations }}`` for
these to reach the pod (docs/scheduling.md shows the snippet; Prefect's own
``annotations`` variable annotates the Job, where HAMi does not look).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.hygon import confine
from gpuflow.hardware.inventory import Resource

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DCU_TYPE_ANNOTATION = "hygon.com/use-dcutype"
HYGON_PLUGIN_ENV = "GPUFLOW_HYGON_DEVICE_PLUGIN"  # "hygon" (default) or "hami"
HYGON_PLUGINS = ("hygon", "hami")


@dataclass(frozen=True)
class RunEnvironment:
    job_id: str
    backend: str
    env_by_node: dict[str, dict[str, str]]
    torch_device: str
    job_variables: dict[str, Any] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """The variables of a single-node placement (the common case)."""
        if len(self.env_by_node) != 1:
            raise InvalidRequestError(
                f"job {self.job_id!r} spans {len(self.env_by_node)} nodes: use env_by_node"
            )
        return next(iter(self.env_by_node.values()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "backend": self.backend,
            "env_by_node": self.env_by_node,
            "torch_device": self.torch_device,
            "job_variables": self.job_variables,
        }


def gpu_product(sku: str) -> str:
    """The value GPU feature discovery gives ``nvidia.com/gpu.product`` for a product name."""
    return sku.strip().replace(" ", "-")


def dcu_type(sku: str) -> str:
    """HAMi's DCU type name ("Z100") from our SKU name ("Hygon DCU Z100")."""
    return sku.split()[-1]


def _check(resources: Sequence[Resource], job_id: str) -> None:
    if not resources:
        raise InvalidRequestError(f"job {job_id!r} has no resources to build an environment from")
    shapes = {(r.sku, r.region, r.kind, r.profile) for r in resources}
    if len(shapes) != 1:
        raise InvalidRequestError(
            f"job {job_id!r}: a placement is one kind of unit on one SKU in one region, got {sorted(map(str, shapes))}"
        )


def run_environment(
    resources: Sequence[Resource], job_id: str, backend: str, hygon_plugin: str | None = None
) -> RunEnvironment:
    """The environment for ``resources`` (one placement); ``backend`` "sim" runs on CPU.
    ``hygon_plugin``: see kubernetes_job_variables."""
    _check(resources, job_id)
    first = resources[0]
    by_node: dict[str, list[Resource]] = {}
    for r in resources:
        by_node.setdefault(r.node, []).append(r)
    env_by_node: dict[str, dict[str, str]] = {}
    for node, rs in by_node.items():
        env: dict[str, str] = {
            "GPUFLOW_JOB_ID": job_id,
            "GPUFLOW_RESOURCE_IDS": ",".join(r.resource_id for r in rs),
        }
        if first.vendor == "Hygon":
            env["HIP_VISIBLE_DEVICES"] = ",".join(str(r.device_index) for r in rs)
            if first.kind == "vdcu":
                env["GPUFLOW_VDCU_ID"] = ",".join(r.resource_id for r in rs)
            env.update(confine.process_environment(first.kind, [r.resource_id for r in rs]))
        else:
            # Device or MIG UUIDs, never indexes: NVML renumbers when a GPU drops off.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(r.resource_id for r in rs)
        env_by_node[node] = env
    torch_device = "cpu" if backend == "sim" else "cuda:0"  # ROCm torch also says "cuda"
    for env in env_by_node.values():
        env["GPUFLOW_TORCH_DEVICE"] = torch_device
    return RunEnvironment(
        job_id=job_id,
        backend=backend,
        env_by_node=env_by_node,
        torch_device=torch_device,
        job_variables=kubernetes_job_variables(resources, job_id, hygon_plugin),
    )


def hygon_plugin_mode(hygon_plugin: str | None = None) -> str:
    """Which device plugin serves the cluster's DCUs: the argument, else
    GPUFLOW_HYGON_DEVICE_PLUGIN, else "hygon" (Hygon's own plugin)."""
    mode = hygon_plugin or os.environ.get(HYGON_PLUGIN_ENV, "").strip().lower() or "hygon"
    if mode not in HYGON_PLUGINS:
        raise InvalidRequestError(
            f"Hygon device plugin {mode!r} is not one of {', '.join(HYGON_PLUGINS)} "
            f"(argument hygon_plugin or {HYGON_PLUGIN_ENV})"
        )
    return mode


def hygon_limits(first: Resource, per_pod: int, mode: str) -> dict[str, str]:
    """Resource limits for ``per_pod`` units shaped like ``first`` on a DCU node.

    Hygon's plugin ("hygon"): whole cards are ``hygon.com/dcu``, a pre-created vDCU its
    ``dcu-share-<CUs>c-<GiB>g`` (one per container, as the plugin allows), a MIG instance
    ``dcu-mig-<profile>``. HAMi ("hami"): ``dcunum`` alone is whole cards; a vDCU adds
    ``dcumem`` (MiB) and ``dcucores`` (percent). Both give a container one vDCU (more are
    asked for as they are, and only the first is confined: Hygon's plugin logs so). Hygon
    MIG exists only in Hygon's plugin, so a MIG lease asks for its name in either mode."""
    if first.kind == "mig":
        return {confine.mig_resource(first.profile or ""): str(per_pod)}
    if first.kind == "vdcu":
        cus, mem = first.compute_units or 0, first.memory_mb
        if mode == "hygon":
            return {confine.share_resource(cus, mem): str(per_pod)}
        from gpuflow.hardware.skus import sku as sku_spec

        total_cu = sku_spec(first.sku).compute_units or 1
        return {
            confine.HAMI_DCUNUM: str(per_pod),
            confine.HAMI_DCUMEM: str(mem),
            confine.HAMI_DCUCORES: str(confine.hami_cores_percent(cus, total_cu)),
        }
    name = confine.DCU_RESOURCE if mode == "hygon" else confine.HAMI_DCUNUM
    return {name: str(per_pod)}


def kubernetes_job_variables(
    resources: Sequence[Resource], job_id: str, hygon_plugin: str | None = None
) -> dict[str, Any]:
    """Job variables for a Kubernetes work pool: resource limits, node selector, annotations,
    env. One pod per node: a multi-node placement asks for the per-node share and leaves the
    node choice to the pod set (a pinned hostname only for one node). ``hygon_plugin``
    ("hygon" or "hami", default GPUFLOW_HYGON_DEVICE_PLUGIN or "hygon") picks the DCU
    resource names."""
    _check(resources, job_id)
    first = resources[0]
    nodes = list(dict.fromkeys(r.node for r in resources))
    per_pod = len(resources) // len(nodes)
    limits: dict[str, str] = {}
    selector: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if first.vendor == "Hygon":
        limits.update(hygon_limits(first, per_pod, hygon_plugin_mode(hygon_plugin)))
        annotations[DCU_TYPE_ANNOTATION] = dcu_type(first.sku)  # read by HAMi's scheduler
    else:
        name = "nvidia.com/gpu" if first.kind == "device" else f"nvidia.com/mig-{first.profile}"
        limits[name] = str(per_pod)
        selector[GPU_PRODUCT_LABEL] = gpu_product(first.sku)
    if len(nodes) == 1:
        selector[HOSTNAME_LABEL] = nodes[0]
    return {
        "env": {"GPUFLOW_JOB_ID": job_id},
        "resources": {"limits": limits},
        "node_selector": selector,
        "pod_annotations": annotations,
        "pods": len(nodes),
    }
