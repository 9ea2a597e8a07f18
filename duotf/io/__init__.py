"""File I/O over any fsspec URL: TFRecord framing (:mod:`.tfrecord`), ``tf.train.Example``
coding (:mod:`.example`), file handling (:mod:`.files`), a ``tf.data`` reader
(:mod:`.tfdata`) and Spark/Dask DataFrames <-> TFRecords (:mod:`.dataframe`).

Nothing here knows about clusters or the engine feed (:mod:`duotf._transport`).
"""
