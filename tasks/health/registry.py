"""The health model a process scores with: the champion in gpuflow's MLflow registry, a
registered model by URI, or the threshold rules.

Apart from tasks.health.model on purpose: that module trains the LSTM (torch, sklearn) and
takes seconds to import, while a fresh install's exporter, monitor and tour score with the
rules; torch is imported here only when the registered model unpickles as an LSTM.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from gpuflow.tasks.health.features import WINDOW_BUCKETS
from gpuflow.tasks.health.rules import RuleModel

if TYPE_CHECKING:
    from gpuflow.tasks.health.model import HealthModel

REGISTERED_MODEL = "gpuflow-health"
CHAMPION_ALIAS = "champion"
# The cheapest candidate on validation of another kind than the champion, scored in shadow
# beside it (tasks.health.shadow); NO_CHALLENGER switches that off.
CHALLENGER_ALIAS = "challenger"
NO_CHALLENGER = "none"
RULES_URI = "rules"
# The logged pyfunc's artifact holding the pickled health model (pyfunc_model.py).
HEALTH_MODEL_ARTIFACT = "health_model"

_champion_cache: dict[str, tuple[str, Any]] = {}


def champion_uri(name: str = REGISTERED_MODEL, alias: str = CHAMPION_ALIAS) -> str:
    return f"models:/{name}@{alias}"


def load_registered(uri: str) -> Any:
    """The health model inside a registered pyfunc (``models:/...`` or ``runs:/...``)."""
    import mlflow.pyfunc

    inner = getattr(mlflow.pyfunc.load_model(uri).unwrap_python_model(), "model", None)
    if inner is None or not hasattr(inner, "predict_risk"):
        raise LookupError(f"{uri} holds no gpuflow health model")
    torch = sys.modules.get("torch")  # loaded by the unpickling when the model is an LSTM
    if torch is not None and isinstance(inner, torch.nn.Module):
        inner.eval()
    return inner


def load_champion(name: str = REGISTERED_MODEL, alias: str = CHAMPION_ALIAS) -> Any:
    """The model under ``alias`` in gpuflow's MLflow registry (whatever kind won: LSTM,
    trees or rules); cached per version, so a monitor loads it once and picks up a new
    champion on its next call. Its ``horizon_s`` and ``threshold_note`` say how it was
    chosen."""
    import mlflow
    from gpuflow.tasks.tracking import tracking_uri
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uri = tracking_uri()
    # The registry follows the store explicitly: mlflow keeps a process-wide registry URI
    # that would otherwise point at the first store this process used.
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = MlflowClient(uri, registry_uri=uri)
    try:
        version = client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        raise LookupError(
            f"no model {name!r} with alias {alias!r} in {uri}: train one first "
            "(`gpuflow health train` or the health_train flow)"
        ) from exc
    key = f"{uri}|{name}|{alias}"
    cached = _champion_cache.get(key)
    if cached is not None and cached[0] == version.version:
        return cached[1]
    model = load_registered(f"models:/{name}/{version.version}")
    # Which version decided, for events and the shadow scorecard (an alias moves).
    model.registry_version = str(version.version)
    _champion_cache[key] = (version.version, model)
    return model


def load_health_model(model_uri: str | None = None) -> tuple[HealthModel, str]:
    """(model, where it came from). None: the registered champion (whatever kind won on
    cost: LSTM, trees or rules), or the threshold rules when none is registered yet (so a
    fresh install still watches its fleet); "rules": the rules; any other string: an
    MLflow model URI (``models:/name@alias``, ``runs:/``) of a health model."""
    if model_uri == RULES_URI:
        return RuleModel(WINDOW_BUCKETS), RULES_URI
    if model_uri is None:
        try:
            return load_champion(), champion_uri()
        except LookupError:
            return RuleModel(WINDOW_BUCKETS), f"{RULES_URI} (no champion registered)"
    alias = registry_alias(model_uri)
    if alias is not None:  # by alias: cached per version, and the version is named
        try:
            return load_champion(*alias), model_uri
        except LookupError as exc:
            raise ValueError(str(exc)) from exc
    import mlflow
    from gpuflow.tasks.tracking import tracking_uri
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_registry_uri(tracking_uri())
    try:
        return load_registered(model_uri), model_uri
    except LookupError as exc:
        raise ValueError(str(exc)) from exc
    except MlflowException as exc:  # no such model, version or alias
        raise ValueError(f"cannot load health model {model_uri!r}: {exc.message}") from exc


def registry_alias(model_uri: str) -> tuple[str, str] | None:
    """(name, alias) of a ``models:/NAME@ALIAS`` URI, else None."""
    prefix = "models:/"
    if not model_uri.startswith(prefix) or "@" not in model_uri:
        return None
    name, _, alias = model_uri[len(prefix) :].rpartition("@")
    return (name, alias) if name and alias and "/" not in alias else None


def challenger_alias_for(alias: str) -> str:
    """The alias of the challenger registered beside ``alias`` (pipeline.log_outcome)."""
    return CHALLENGER_ALIAS if alias == CHAMPION_ALIAS else f"{alias}-{CHALLENGER_ALIAS}"


def load_challenger(
    model_uri: str | None = None, challenger_uri: str | None = None
) -> tuple[HealthModel | None, str | None]:
    """(model, where it came from) to score in shadow beside ``model_uri``, or (None,
    None). ``challenger_uri``: None for the challenger registered beside the model
    ``model_uri`` names by alias (None: gpuflow's champion; none when it is not named by
    an alias, or no challenger is registered); NO_CHALLENGER for none; else an MLflow URI,
    which must load."""
    if challenger_uri == NO_CHALLENGER:
        return None, None
    if challenger_uri is not None:
        return load_health_model(challenger_uri)
    named = (REGISTERED_MODEL, CHAMPION_ALIAS) if model_uri is None else registry_alias(model_uri)
    if named is None or named[1].endswith(CHALLENGER_ALIAS):
        return None, None
    name, alias = named[0], challenger_alias_for(named[1])
    try:
        return load_champion(name, alias), champion_uri(name, alias)
    except LookupError:
        return None, None


__all__ = [
    "CHALLENGER_ALIAS",
    "CHAMPION_ALIAS",
    "HEALTH_MODEL_ARTIFACT",
    "REGISTERED_MODEL",
    "RULES_URI",
    "champion_uri",
    "NO_CHALLENGER",
    "load_challenger",
    "load_champion",
    "load_health_model",
    "load_registered",
    "challenger_alias_for",
    "registry_alias",
]
