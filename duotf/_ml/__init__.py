"""The engine-neutral halves of the ML stages (internal): the estimators' parameters, the Keras
node program (:mod:`.keras_node`), the slot ledger (:mod:`.estimator`), resuming a fit from its
checkpoint (:mod:`.resume`), and scoring a saved model in an engine's
own tasks (:mod:`.scoring`). :mod:`duotf.spark` and :mod:`duotf.dask` build on them."""
