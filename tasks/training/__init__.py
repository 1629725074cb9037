"""Training workloads: models (tasks.training.models) and offline data (tasks.training.data)."""
