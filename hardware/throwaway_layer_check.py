"""Throwaway: shows that the layer test catches Prefect under hardware/."""

import prefect  # noqa: F401
