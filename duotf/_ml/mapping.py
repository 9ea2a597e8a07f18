"""What a ``TFModel`` scores, in both engines' stages: its SavedModel signature and tags, the
columns mapped onto the signature's inputs and its outputs onto columns (TensorFlowOnSpark's
``input_mapping`` / ``output_mapping``), and a classifier's columns (Spark ML's
``rawPredictionCol``, ``probabilityCol`` and ``predictionCol``).

:func:`model_outputs` is the one place both TFModels resolve their parameters into the input
columns (in the model's input order) and the output columns of a scoring plan
(:mod:`duotf._ml.scoring`); a classifier's columns are derived from its scores in the scoring
task (:func:`~duotf._ml.scoring.derived`). Parameters are named in Spark ML's camelCase here; the Dask twin
respells its errors.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Optional, Tuple

from duotf._ml import scoring
from duotf._ml.scoring import derived, probabilities  # their home: the scoring task
from duotf.errors import ConfigError

__all__ = ["Scoring", "model_outputs", "mapped_columns", "mapped_outputs", "classifier_columns",
           "probabilities", "derived"]


@dataclasses.dataclass(frozen=True)
class Scoring:
    """A TFModel's parameters resolved against its model: the ``source`` (signature and tags
    included), the loaded ``model``, the input ``columns`` in the model's input order, the
    ``outputs`` and whether they are a classifier's (``classifier``)."""

    source: scoring.ModelSource
    model: scoring.Model
    columns: Tuple[str, ...]
    outputs: Tuple[scoring.OutputColumn, ...]
    classifier: bool


def mapped_columns(model: scoring.Model, input_mapping: Mapping[str, str]) -> Tuple[str, ...]:
    """The columns of ``input_mapping`` (``{column: signature input name}``) in the model's input
    order; every input must be fed by one column (a :class:`~duotf.ConfigError` lists them)."""
    if model.inputs is None:
        raise ConfigError("inputMapping: the model (a plain callable) does not name its inputs; "
                          "set featuresCol instead", param="inputMapping")
    names = [i.name for i in model.inputs]
    by_input: Dict[str, str] = {}
    for column, name in input_mapping.items():
        if name not in names:
            raise ConfigError(f"inputMapping {{{column!r}: {name!r}}}: the signature has no input "
                              f"{name!r}; its inputs are {names}", param="inputMapping",
                              inputs=names)
        if name in by_input:
            raise ConfigError(f"inputMapping maps both {by_input[name]!r} and {column!r} onto the "
                              f"input {name!r}: map one column onto each input", param="inputMapping")
        by_input[name] = column
    missing = [n for n in names if n not in by_input]
    if missing:
        raise ConfigError(f"inputMapping feeds no column to the signature's input(s) {missing}: "
                          f"map one column onto each of its inputs {names}", param="inputMapping",
                          inputs=names)
    return tuple(by_input[n] for n in names)


def mapped_outputs(model: scoring.Model, output_mapping: Mapping[str, str]) -> Dict[str, str]:
    """``{column: output name}`` of ``output_mapping`` (``{signature output name: column}``); an
    output the signature lacks is a :class:`~duotf.ConfigError` listing its outputs."""
    names = [o.name for o in model.outputs] if model.outputs is not None else None
    out: Dict[str, str] = {}
    for name, column in output_mapping.items():
        if names is not None and name not in names:
            raise ConfigError(f"outputMapping {{{name!r}: {column!r}}}: the signature has no output "
                              f"{name!r}; its outputs are {names}", param="outputMapping",
                              outputs=names)
        if column in out:
            raise ConfigError(f"outputMapping names the column {column!r} twice: give each output "
                              "a column of its own", param="outputMapping")
        out[str(column)] = str(name)
    return out


def classifier_columns(model: scoring.Model, output: str, prediction: Optional[str],
                       probability: Optional[str], raw: Optional[str]
                       ) -> Tuple[scoring.OutputColumn, ...]:
    """A classifier's columns of the model output ``output`` (its scores, one per class):
    ``raw`` (the scores, array<double>), ``probability`` (:func:`probabilities`) and
    ``prediction`` (the index of the largest score, a double), each where named."""
    info = {o.name: o for o in model.outputs or ()}.get(output)
    if info is not None and info.shape is not None and info.size is not None and info.size < 2:
        raise ConfigError(f"probabilityCol/rawPredictionCol: the model's output {output!r} holds "
                          f"{info.size} value a row; a classifier's columns need one score per "
                          "class (an output of shape [classes])", param="probabilityCol",
                          output=output)
    kinds = ((raw, "array<double>", "raw"), (probability, "array<double>", "probability"),
             (prediction, "double", "argmax"))
    return tuple(scoring.OutputColumn(str(c), output, t, d) for c, t, d in kinds if c)


def model_outputs(path: str, *, features, prediction: Optional[str],
                  output_cols: Optional[Mapping[str, str]] = None,
                  signature: Optional[str] = None, tags=None,
                  input_mapping: Optional[Mapping[str, str]] = None,
                  output_mapping: Optional[Mapping[str, str]] = None,
                  probability: Optional[str] = None, raw: Optional[str] = None,
                  argmax: Optional[str] = None) -> Scoring:
    """Resolve a TFModel's parameters against its model (loaded once here, into this process's
    cache). ``inputMapping`` replaces ``featuresCol``; ``outputMapping`` replaces ``outputCols``
    (both set: a ConfigError). With ``probabilityCol`` or ``rawPredictionCol`` the model is a
    classifier: its scores are its only output, or the first of ``outputMapping``/``outputCols``
    (whose columns are kept), and ``predictionCol`` is the class (the largest score's index), as
    is ``argmaxCol`` where set (outside a classifier, the TFModel adds ``argmaxCol`` itself)."""
    from duotf._ml.estimator import feature_names

    source = scoring.model_source(path, signature or scoring.DEFAULT_SIGNATURE, tags)
    model = scoring.get_model(source)
    if input_mapping:
        columns = mapped_columns(model, input_mapping)
    else:
        columns = scoring.input_columns(model, list(feature_names(features)))
    if output_mapping and output_cols:
        raise ConfigError(f"outputMapping={dict(output_mapping)} and outputCols={dict(output_cols)} "
                          "both name the output columns: set one of them", param="outputMapping")
    mapping = mapped_outputs(model, output_mapping) if output_mapping else output_cols or None
    classifier = bool(probability or raw)
    if not classifier:
        outputs = scoring.output_columns(model, mapping or prediction)
    elif mapping:
        outputs = scoring.output_columns(model, mapping)
        outputs += classifier_columns(model, outputs[0].output, prediction, probability, raw)
    else:
        scores = scoring.output_columns(model, prediction)[0]  # the model's only output
        outputs = classifier_columns(model, scores.output, prediction, probability, raw)
    if classifier and argmax:
        outputs += classifier_columns(model, outputs[-1].output, argmax, None, None)
    scoring.check_outputs(model, outputs)
    return Scoring(source, model, tuple(columns), tuple(outputs), classifier)
