"""Resuming an interrupted fit: a ``runId`` names the fit's folder, ``modelDir/<runId>``, instead
of a fresh one, and a fit given a ``runId`` whose folder holds a checkpoint goes on from it.

The node program of a ``modelFn`` (:func:`duotf._ml.keras_node.keras_main`) keeps, with a
``runId``, a checkpoint of the run: at the end of every epoch its chief saves the model (weights
and optimizer state) as ``checkpoint-<epochs done>.keras``, then writes :data:`STATE_FILE`
(``run.json``: the epochs done, the history so far, the file of that checkpoint and the fit's
parameters) to a temporary name and renames it over the last one, then deletes the older
checkpoint. ``run.json`` is the commit point: a driver or a node killed while a checkpoint is
written leaves the previous ``run.json``, which names a whole file. (On an object store the
rename is a copy, but each write of ``run.json`` is whole, so the same holds.)

A fit given that ``runId`` again (:func:`open_run`, on the driver) reads ``run.json``:

* no ``run.json``: a new run, from epoch 0;
* a checkpoint after ``k`` of ``epochs``: every node builds ``modelFn()`` in its strategy's scope,
  builds the optimizer and loads the checkpoint into both, and fits with ``initial_epoch=k``;
  the driver feeds the ``epochs - k`` epochs left; the fitted model's history holds all of them
  (the first ``k`` from ``run.json``);
* a finished run (``run.json`` says so and the model is there): the fit trains nothing and
  returns that model, so a script rerun after a crash of a later step does not train it again.

**Fenced.** A driver killed with SIGKILL leaves its nodes running for a few seconds (until
they miss its heartbeats), and a fit resumed at once would share the folder with them. So each
fit of a ``runId`` writes a new token to :data:`OWNER_FILE` when it opens the run, and its chief
commits a checkpoint only while the file still holds its token: it reads the file before it
saves the checkpoint and again before it renames ``run.json``, and ends with
:class:`RunTakenOverError` instead once another fit has taken the run. A node of the old fit
that read its token just before the new fit wrote its own can still commit in the moments
between that read and the rename, never after.

A ``runId`` started with other parameters (``epochs``, ``batchSize``, the columns, the
validation split, ``seed``) is refused with a :class:`~duotf.errors.ConfigError` naming them:
resuming it would be another fit under the same name (give a new ``runId``). ``numWorkers`` may
change (every worker holds the same weights). A ``trainFn`` (your own node program) gets the
run's folder as ``args["modelDir"]`` and ``args["runId"]``, and the finished-run return; how it
checkpoints and resumes inside is its own (the driver feeds it every epoch).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from duotf.errors import ConfigError
from duotf._ml.fitdir import MODEL_FILE

if TYPE_CHECKING:
    from duotf._ml.estimator import FitConfig

logger = logging.getLogger("duotf._ml.estimator")

__all__ = ["STATE_FILE", "OWNER_FILE", "RUN_PARAMS", "RunState", "RunTakenOverError", "check_run_id",
           "run_params", "open_run",
           "finish_run", "write_state", "checkpoint_callback", "restore"]

#: the run's state, in its folder: the commit point of every checkpoint
STATE_FILE = "run.json"
#: the token of the fit that holds the run, in its folder (removed when the run finishes)
OWNER_FILE = "owner"
#: the parameters a resumed run must share with the run it resumes
RUN_PARAMS = ("epochs", "batchSize", "featuresCol", "labelCol", "weightCol",
              "validationIndicatorCol", "validationFraction", "seed")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: Any, model_dir: Optional[str]) -> None:
    """A ``runId`` is a folder name (letters, digits, ``.``, ``_``, ``-``) and needs ``modelDir``."""
    if run_id is None:
        return
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise ConfigError(f"runId={run_id!r}: give a folder name of letters, digits, '.', '_' and "
                          "'-' (at most 128, not starting with '.', '_' or '-')", param="runId")
    if model_dir is None:
        raise ConfigError(f"runId={run_id!r} names a folder of modelDir, which is not set: set "
                          "modelDir to a folder every node and the driver can reach", param="modelDir")


class RunTakenOverError(RuntimeError):
    """A node's fit no longer holds its ``runId``: another fit of it has started (its driver
    was lost, and the run resumed). The node commits nothing more and ends."""


@dataclasses.dataclass(frozen=True)
class RunState:
    """What a run's folder holds when a fit with its ``runId`` starts."""

    folder: str
    #: the epochs done (0: a new run)
    done: int = 0
    #: the history of those epochs, ``{metric: [value per epoch]}``
    history: Dict[str, List[float]] = dataclasses.field(default_factory=dict)
    #: the checkpoint to resume from (None: a new run, or a finished one)
    checkpoint: Optional[str] = None
    #: the run finished: its model is there
    finished: bool = False
    #: this fit's token in :data:`OWNER_FILE` ("" for a finished run)
    owner: str = ""

    def node_args(self) -> Optional[Dict[str, Any]]:
        """What the nodes get as ``args["resume"]``: None for a new run."""
        if self.checkpoint is None:
            return None
        return {"checkpoint": self.checkpoint, "epoch": self.done, "history": self.history}


def _owner(folder: str) -> Optional[str]:
    """The token in the run's :data:`OWNER_FILE` (None: no file)."""
    from duotf.io.files import filesystem

    fs, path = filesystem(folder.rstrip("/") + "/" + OWNER_FILE)
    try:
        with fs.open(path, "rb") as f:
            return f.read().decode("utf-8").strip()
    except FileNotFoundError:
        return None


def _take(folder: str) -> str:
    """Write a new token to the run's :data:`OWNER_FILE`: this fit holds the run from now on."""
    from duotf.io.files import filesystem

    token = uuid.uuid4().hex
    fs, path = filesystem(folder.rstrip("/") + "/" + OWNER_FILE)
    fs.pipe_file(path, token.encode("utf-8"))
    return token


def run_params(config: "FitConfig") -> Dict[str, Any]:
    """The run's :data:`RUN_PARAMS`, as ``run.json`` holds them."""
    return {name: (list(v) if isinstance(v, tuple) else v)
            for name, v in ((n, getattr(config, n)) for n in RUN_PARAMS)}


def _read(folder: str) -> Optional[Dict[str, Any]]:
    from duotf.io.files import filesystem

    fs, path = filesystem(folder.rstrip("/") + "/" + STATE_FILE)
    if not fs.exists(path):
        return None
    with fs.open(path, "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def write_state(folder: str, state: Dict[str, Any]) -> None:
    """Write ``run.json`` whole: to a temporary name first, then renamed over the last one."""
    from duotf.io.files import filesystem

    fs, path = filesystem(folder.rstrip("/") + "/" + STATE_FILE)
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    fs.pipe_file(tmp, json.dumps(state, default=repr).encode("utf-8"))
    fs.mv(tmp, path)


def open_run(config: "FitConfig", saved_model) -> RunState:
    """The run's folder ``modelDir/<runId>`` (made if new) and what it holds; ``saved_model``
    finds a finished run's model (:func:`duotf._ml.fitdir.saved_model_path`). A run started
    with other :data:`RUN_PARAMS` is a ConfigError naming them."""
    from duotf.io.files import filesystem

    assert config.modelDir is not None and config.runId is not None  # FitConfig checks
    folder = config.modelDir.rstrip("/") + "/" + config.runId
    fs, path = filesystem(folder)
    fs.makedirs(path, exist_ok=True)
    state = _read(folder)
    if state is None:
        if saved_model(folder) is not None:  # a trainFn's run, finished
            return RunState(folder, config.epochs, finished=True)
        return RunState(folder, owner=_take(folder))
    mine = run_params(config)
    differ = [f"{n}={state['params'].get(n)!r} (now {mine[n]!r})" for n in RUN_PARAMS
              if state["params"].get(n) != mine[n]]
    if differ:
        raise ConfigError(f"runId={config.runId!r} was started with {', '.join(differ)}: resume it "
                          "with its parameters, or give a new runId for a new fit",
                          param="runId", folder=folder)
    history = state.get("history") or {}
    if state.get("finished") and saved_model(folder) is not None:
        return RunState(folder, state["done"], history, finished=True)
    checkpoint = folder + "/" + state["model"] if state.get("model") else None
    if checkpoint is not None and state["done"] >= config.epochs:
        # every epoch done, the driver gone before the model was saved: the last checkpoint is it
        fs.copy(filesystem(checkpoint)[1], path.rstrip("/") + "/" + MODEL_FILE)
        finish_run(config, folder, history)
        return RunState(folder, state["done"], history, finished=True)
    # the token first, then the state it resumes from: a node of a lost fit commits nothing
    # after the token changed (see the module docstring)
    owner = _take(folder)
    state = _read(folder) or state
    checkpoint = folder + "/" + state["model"] if state.get("model") else None
    return RunState(folder, state["done"], state.get("history") or {}, checkpoint, owner=owner)


def finish_run(config: "FitConfig", folder: str, history: Dict[str, List[float]]) -> None:
    """Mark the run finished (its model saved) and delete its last checkpoint."""
    from duotf.io.files import filesystem

    last = _read(folder) or {}
    losses = history.get("loss")
    done = len(losses) if isinstance(losses, list) else config.epochs  # fewer: EarlyStopping
    write_state(folder, {"params": run_params(config), "done": done, "history": history,
                         "model": None, "finished": True})
    for name in (last.get("model"), OWNER_FILE):
        if name:
            fs, path = filesystem(folder.rstrip("/") + "/" + name)
            if fs.exists(path):
                fs.rm(path)


# -- on the nodes ----------------------------------------------------------------------------------
def restore(model, checkpoint: str) -> None:
    """Load ``checkpoint`` (a ``.keras`` file) into ``model``, optimizer state included; called
    in the strategy's scope, where the optimizer's variables are made."""
    if not model.built:
        raise ConfigError("modelFn returned a model that is not built, and a checkpoint can only "
                          "be loaded into a built one: give it its input shape (keras.Input) so "
                          "that the run can resume", param="modelFn")
    model.optimizer.build(model.trainable_variables)
    model.load_weights(checkpoint)


def checkpoint_callback(args: Dict[str, Any]):
    """The chief's Keras callback keeping the run's checkpoint (see the module's docstring)."""
    import keras

    from duotf.io.files import filesystem

    folder = args["modelDir"]
    params = args["runParams"]
    token = args.get("runOwner")
    start = args["resume"] or {"epoch": 0, "history": {}, "checkpoint": None}
    fs, _ = filesystem(folder)

    def still_held(done: int) -> None:
        if token is not None and _owner(folder) != token:
            raise RunTakenOverError(
                f"runId={args['runId']!r} was taken over by another fit (this fit's driver was "
                f"lost and the run resumed): this node commits no checkpoint after epoch {done} "
                f"to {folder} and ends")

    class RunCheckpoint(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.history = {k: list(v) for k, v in start["history"].items()}
            self.last = start["checkpoint"]

        def on_epoch_end(self, epoch, logs=None):
            done = epoch + 1  # Keras counts from 0 (from initial_epoch on a resumed fit)
            for key, value in (logs or {}).items():
                self.history.setdefault(key, []).append(float(value))
            name = f"checkpoint-{done}.keras"
            still_held(done)
            self.model.save(folder.rstrip("/") + "/" + name)
            try:
                still_held(done)  # the commit: only while this fit holds the run
            except RunTakenOverError:
                fs.rm(filesystem(folder.rstrip("/") + "/" + name)[1])  # taken over while it
                raise  # saved: the new fit is epochs behind, so the file is this node's own
            write_state(folder, {"params": params, "done": done, "history": self.history,
                                 "model": name, "finished": False})
            if self.last is not None and self.last != folder.rstrip("/") + "/" + name:
                fs.rm(filesystem(self.last)[1])
            self.last = folder.rstrip("/") + "/" + name
            logger.debug("TFEstimator: checkpoint after epoch %d in %s", done, folder)

    return RunCheckpoint()
