"""The driver's side (internal): ``duotf.run`` and the :class:`Cluster` it returns, the
supervisor of the nodes, the feed planner, restarts, parallel runs, the doctor and the command
line. Calls down into :mod:`duotf.backends`, never into an engine's own modules."""
