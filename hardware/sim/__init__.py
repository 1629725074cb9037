"""The digital twin of a mixed fleet: SimBackend and its cluster spec.

Modules: cluster_spec (YAML fleet), state (shared JSON + lock), clock (sim time),
physics (power/heat/throttling), hazard (failure schedules, pure), faults (fault classes),
workloads (tenants and sharing), fleet (running devices forward), backend (SimBackend,
composed of core and one module per kind of Backend call: partitions_api, clocks_api,
tenants_api, faults_api). No Prefect, no torch.
"""

from gpuflow.hardware.sim.backend import SimBackend
from gpuflow.hardware.sim.cluster_spec import ClusterSpec, ClusterSpecError, load_cluster_spec
from gpuflow.hardware.sim.faults import FAULT_KINDS

__all__ = ["FAULT_KINDS", "ClusterSpec", "ClusterSpecError", "SimBackend", "load_cluster_spec"]
