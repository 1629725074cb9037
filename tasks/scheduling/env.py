"""What a placement becomes for the job that runs on it.

On a host: the variables that make the runtime see exactly the leased units -
CUDA_VISIBLE_DEVICES with GPU or MIG UUIDs (CUDA accepts ``MIG-<uuid>`` there; one MIG
instance per process is what CUDA enumerates), HIP_VISIBLE_DEVICES with DCU indexes for
Hygon (ROCm's variable; vDCU selection on bare metal is driver-specific, so the vDCU id
is passed as GPUFLOW_VDCU_ID for the launcher) - and the torch device to use.

On Kubernetes (a Prefect Kubernetes work pool): job variables with the extended resource
names the device plugins register - ``nvidia.com/gpu``, ``nvidia.com/mig-<profile>``
(the plugin's "mixed" MIG strategy), Hygon's ``hygon.com/dcunum`` with HAMi's
``hygon.com/dcumem`` (MiB) and ``hygon.com/dcucores`` (percent of the card's cores) for a
vDCU - and a node selector: ``nvidia.com/gpu.product`` (the label GPU feature discovery
sets: the product name with spaces as dashes) for NVIDIA, HAMi's ``hygon.com/use-dcutype``
annotation for Hygon, and the node itself when the placement is on one node. The work
pool's base job template must reference ``{{ resources }}``, ``{{ node_selector }}`` and
``{{ pod_annotations }}`` for these to reach the pod (docs/scheduling.md shows the snippet;
Prefect's own ``annotations`` variable annotates the Job, where HAMi does not look).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Resource

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DCU_TYPE_ANNOTATION = "hygon.com/use-dcutype"


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


def run_environment(resources: Sequence[Resource], job_id: str, backend: str) -> RunEnvironment:
    """The environment for ``resources`` (one placement); ``backend`` "sim" runs on CPU."""
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
        job_variables=kubernetes_job_variables(resources, job_id),
    )


def kubernetes_job_variables(resources: Sequence[Resource], job_id: str) -> dict[str, Any]:
    """Job variables for a Kubernetes work pool: resource limits, node selector, annotations,
    env. One pod per node: a multi-node placement asks for the per-node share and leaves the
    node choice to the pod set (a pinned hostname only for one node)."""
    _check(resources, job_id)
    first = resources[0]
    nodes = list(dict.fromkeys(r.node for r in resources))
    per_pod = len(resources) // len(nodes)
    limits: dict[str, str] = {}
    selector: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if first.vendor == "Hygon":
        limits["hygon.com/dcunum"] = str(per_pod)
        if first.kind == "vdcu":
            # HAMi: dcumem in MiB, dcucores as a percentage of the card's compute units.
            from gpuflow.hardware.skus import sku as sku_spec

            total_cu = sku_spec(first.sku).compute_units or 1
            limits["hygon.com/dcumem"] = str(first.memory_mb)
            limits["hygon.com/dcucores"] = str(
                max(1, round(100 * (first.compute_units or 0) / total_cu))
            )
        annotations[DCU_TYPE_ANNOTATION] = dcu_type(first.sku)
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
