"""The Dask engine: :class:`~duotf.backends.dask.backend.DaskBackend` (nodes as worker tasks) and
its feed (:mod:`.feed`)."""
