"""The Spark engine: :class:`~duotf.backends.spark.backend.SparkBackend` (the node gang as a
barrier stage), its feed (:mod:`.feed`) and the JVM helpers (:mod:`.jvm`)."""
