"""How a Hygon partition reaches the process or pod that runs on it (pure; runs no command).

What confines a process to a vDCU is a *file*, not an environment variable:

- A vDCU's configuration is ``/etc/vdev/vdev<N>.conf`` on the host (``PciBusId``,
  ``cu_mask``, ``cu_count``, ``mem``, ``device_id``, ``vdev_id``, ``pipe_id``,
  ``enable``). The DTK/hyhal user-space runtime confines a process to that vDCU when the
  file is visible to it at ``/etc/vdev/docker/vdev<N>.conf``. Sources: Hygon's own device
  plugin (``AllocateVirtualDCUs`` mounts ``/etc/vdev/<id>.conf`` read-only at
  ``/etc/vdev/docker/<id>.conf``; mirrored in github.com/kinglong08/k8s-dcu-device-plugin,
  internal/pkg/plugin/plugin.go, "Copyright 2026 Hygon Information Technology"); Hygon's
  container toolkit (github.com/HYGON-AI/hcu-container-toolkit,
  internal/discover/mounts.go ``addVHCU``: the same mount, chosen by the container's
  ``VHCU_VISIBLE_DEVICES``); HAMi's DCU plugin (github.com/Project-HAMi/dcu-vgpu-device-plugin,
  internal/pkg/dcu/server.go writes ``vdev0.conf`` and mounts its folder at
  ``/etc/vdev/docker/``); Dynamia's HAMi/vDCU article (2025-07-31, adapted from
  mp.weixin.qq.com/s/gpyhltXK3CSTkwk4ZwD74A: the ``docker run -v
  /etc/vdev/vdev0.conf:/etc/vdev/docker/vdev0.conf:ro`` recipe). No public source names an
  environment variable the runtime itself reads, or how a process outside a container is
  confined: gpuflow passes the two paths to the launcher (unverified: no DCU here).
- A Hygon MIG compute instance's configuration is
  ``/etc/dmi_mig_config/ci/dev<D>gi<G>ci<C>.conf`` (it carries ``pci:`` and ``mig_uuid:``);
  Hygon's plugin mounts exactly that file at the same path (``AllocateMigDCUs``), and the
  container toolkit picks it by ``MIG_VISIBLE_DEVICES=MIG-<uuid>`` (``addMIG``).

On Kubernetes, the resource names of Hygon's own device plugin (its README, v2.4.2, policy
0): ``hygon.com/dcu`` for a whole DCU, ``hygon.com/dcu-share-<CUs>c-<GiB>g`` for a
pre-created vDCU (GiB rounded: ``util/dcu.go`` ``GetAllVirtualDCUs``), and
``hygon.com/dcu-mig-<profile with '.' as '-'>`` for a MIG instance (``GetAllMigDCUs``:
``4g.31gb`` -> ``dcu-mig-4g-31gb``). A vDCU carved at pod start (the plugin's ``hami``
strategy, or HAMi's dcu-vgpu-device-plugin) is asked for with HAMi's names:
``hygon.com/dcunum`` (slots), ``hygon.com/dcumem`` (MiB) and ``hygon.com/dcucores``
(percent of the card's CUs) (HAMi pkg/device/hygon/device.go ``ParseConfig``).
"""

from __future__ import annotations

import math
import re

from gpuflow.hardware.backend import InvalidRequestError

VDCU_CONF_DIR = "/etc/vdev"  # the host's vDCU configuration files
VDCU_RUNTIME_DIR = "/etc/vdev/docker"  # where the runtime looks for the one it is confined to
MIG_CONF_DIR = "/etc/dmi_mig_config/ci"

# Hygon's device plugin (resource namespace "hygon.com", naming policy 0).
DCU_RESOURCE = "hygon.com/dcu"
DCU_SHARE_PREFIX = "hygon.com/dcu-share-"
DCU_MIG_PREFIX = "hygon.com/dcu-mig-"
# HAMi (and the Hygon plugin's "hami" strategy): vDCUs carved at pod start.
HAMI_DCUNUM = "hygon.com/dcunum"
HAMI_DCUMEM = "hygon.com/dcumem"
HAMI_DCUCORES = "hygon.com/dcucores"

_VDCU_ID = re.compile(r"^vdcu-(\d+)$")  # HygonBackend's vDCU ids (hy-smi's "Virtual Device N")
_MIG_ID = re.compile(r"^dcu(\d+)-mig-gi(\d+)$")  # HygonBackend's MIG ids (hygon/mig.py)
# Kubernetes extended resource names: a DNS subdomain prefix, then a name of at most 63.
_K8S_NAME = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def vdev_number(resource_id: str) -> int | None:
    """hy-smi's virtual device number in a HygonBackend vDCU id (``vdcu-3`` -> 3), else None
    (the twin's ``VDCU-…`` ids name no hy-smi device)."""
    m = _VDCU_ID.match(resource_id)
    return int(m.group(1)) if m else None


def vdcu_conf_path(resource_id: str) -> str | None:
    """The host file that describes vDCU ``resource_id``: ``/etc/vdev/vdev<N>.conf``."""
    n = vdev_number(resource_id)
    return None if n is None else f"{VDCU_CONF_DIR}/vdev{n}.conf"


def vdcu_runtime_path(resource_id: str) -> str | None:
    """Where that file must appear for the runtime to confine a process to the vDCU."""
    n = vdev_number(resource_id)
    return None if n is None else f"{VDCU_RUNTIME_DIR}/vdev{n}.conf"


def mig_conf_path(resource_id: str, compute_instance: int = 0) -> str | None:
    """``/etc/dmi_mig_config/ci/dev<D>gi<G>ci<C>.conf`` for a HygonBackend MIG id.

    gpuflow creates one compute instance per GPU instance (``hy-smi mig -cgi ID -C``); that
    it gets id 0, as under nvidia-smi, is unverified (no DCU here)."""
    m = _MIG_ID.match(resource_id)
    if m is None:
        return None
    return f"{MIG_CONF_DIR}/dev{m.group(1)}gi{m.group(2)}ci{compute_instance}.conf"


def process_environment(kind: str, resource_ids: list[str]) -> dict[str, str]:
    """gpuflow's variables that tell a launcher which partition file the process must see.

    ``GPUFLOW_VDCU_CONF`` (host paths) and ``GPUFLOW_VDCU_RUNTIME_PATH`` (where each must be
    bind-mounted, read-only, in the process's mount namespace or container) for vDCUs;
    ``GPUFLOW_DCU_MIG_CONF`` (mounted at the same path) for MIG. Ids the paths cannot be
    derived from (the twin's) add nothing."""
    env: dict[str, str] = {}
    if kind == "vdcu":
        confs = [vdcu_conf_path(r) for r in resource_ids]
        runtime = [vdcu_runtime_path(r) for r in resource_ids]
        if all(confs):
            env["GPUFLOW_VDCU_CONF"] = ",".join(c for c in confs if c)
            env["GPUFLOW_VDCU_RUNTIME_PATH"] = ",".join(p for p in runtime if p)
    elif kind == "mig":
        confs = [mig_conf_path(r) for r in resource_ids]
        if all(confs):
            env["GPUFLOW_DCU_MIG_CONF"] = ",".join(c for c in confs if c)
    return env


def share_resource(compute_units: int, memory_mb: int) -> str:
    """Hygon's plugin name for a pre-created vDCU: ``hygon.com/dcu-share-<CUs>c-<GiB>g``.

    The plugin rounds the vDCU's bytes to GiB half away from zero (Go's ``math.Round``)."""
    if compute_units < 1 or memory_mb < 1:
        raise InvalidRequestError(
            f"a vDCU needs compute units and memory, got {compute_units} CUs, {memory_mb} MiB"
        )
    gib = math.floor(memory_mb / 1024 + 0.5)
    return f"{DCU_SHARE_PREFIX}{compute_units}c-{gib}g"


def mig_resource(profile: str) -> str:
    """Hygon's plugin name for a MIG instance: ``hygon.com/dcu-mig-<profile, '.' -> '-'>``."""
    name = DCU_MIG_PREFIX + profile.removeprefix("MIG ").replace(".", "-")
    if not _K8S_NAME.match(name):
        raise InvalidRequestError(
            f"MIG profile {profile!r} gives {name!r}, which is not a Kubernetes resource name"
        )
    return name


def hami_cores_percent(compute_units: int, card_compute_units: int) -> int:
    """HAMi's ``dcucores``: the vDCU's share of the card's CUs in percent (1..100)."""
    total = card_compute_units or 1
    return max(1, min(100, round(100 * compute_units / total)))
