"""Hygon DCUs on this host through the ``hy-smi`` command line.

Laid out like nvml/: ``command`` runs hy-smi (argv lists, a timeout, its ``-h`` flags),
``parse`` reads its output and ``fields`` names its ``--json`` fields; ``inventory`` is
what the DCUs are and offer, ``vdcu``, ``mig``, ``telemetry`` and ``control`` the logic on
top; ``backend`` checks node and index and composes them into HygonBackend.
"""

from gpuflow.hardware.hygon.backend import HygonBackend
from gpuflow.hardware.hygon.inventory import sku_name_for
from gpuflow.hardware.hygon.vdcu import VDCU_MAX_COUNT, VDCU_PREFIX

__all__ = ["VDCU_MAX_COUNT", "VDCU_PREFIX", "HygonBackend", "sku_name_for"]
