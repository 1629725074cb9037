"""The health champion as an MLflow pyfunc, logged as code (MLflow's "models from code").

MLflow loads this file from the logged model's code/ folder and calls ``load_context``
with the model's artifacts. The champion is whichever kind won on cost (LSTM, trees or
rules), so the registry holds one kind of thing for all of them: this wrapper, and the
health model itself pickled as the artifact ``health_model`` (model.save_health_model;
its classes are gpuflow's, imported by name when it is read). Logging a PythonModel
*object* instead made MLflow cloudpickle the wrapper by value, and warn about it on every
`health_train`.

``predict`` takes windows [n, window, F] and returns the risks [n, H]. Its input is
hinted ``np.ndarray``, one of the hints MLflow accepts without inferring a schema of
records from it (a missing hint or ``Any`` makes it warn at every log). No ``from
__future__ import annotations`` here: MLflow reads the hint as a type.
"""

import pickle

import mlflow.models
import mlflow.pyfunc
import numpy as np
from gpuflow.tasks.health.registry import HEALTH_MODEL_ARTIFACT


class HealthPyfunc(mlflow.pyfunc.PythonModel):
    """Any gpuflow health model behind MLflow's pyfunc interface."""

    def __init__(self) -> None:
        self.model = None

    def load_context(self, context) -> None:
        # The control plane's own registry: the same trust as the code that wrote it.
        with open(context.artifacts[HEALTH_MODEL_ARTIFACT], "rb") as f:
            self.model = pickle.load(f)  # noqa: S301

    def predict(self, context, model_input: np.ndarray, params=None) -> np.ndarray:
        return self.model.predict_risks(np.asarray(model_input, dtype=np.float32))


mlflow.models.set_model(HealthPyfunc())
