"""A fit's folder, ``modelDir/fit-...`` or ``modelDir/<runId>``: where its model is, whichever
way it was saved. The estimator writes it, the run state (:mod:`duotf._ml.resume`) reads it."""

from __future__ import annotations

from typing import Optional

__all__ = ["MODEL_FILE", "EXPORT_DIR", "saved_model_path"]

#: the file the chief saves a ``modelFn`` model to, in the fit's folder
MODEL_FILE = "model.keras"
#: where a ``trainFn`` may export a SavedModel instead, in the fit's folder
EXPORT_DIR = "export"


def saved_model_path(fit_dir: str) -> Optional[str]:
    """The model a fit left in ``fit_dir``: ``model.keras``, else ``export/`` (a SavedModel)."""
    from duotf.io.files import filesystem

    fs, path = filesystem(fit_dir)
    if fs.exists(path.rstrip("/") + "/" + MODEL_FILE):
        return fit_dir.rstrip("/") + "/" + MODEL_FILE
    if fs.exists(path.rstrip("/") + "/" + EXPORT_DIR + "/saved_model.pb"):
        return fit_dir.rstrip("/") + "/" + EXPORT_DIR
    return None
