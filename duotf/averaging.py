"""Periodic weight averaging for TF2: TensorOnSpark's ``sync_interval``.

Each worker trains a model of its own, on its own data (its ``DataFeed``, or its share of the
files), with no collective in its steps; every ``every`` steps the workers average their
weights, and each continues from the average. ``every=1`` is synchronous SGD's result for plain
SGD (the average of the updated weights is the update by the averaged gradient); larger values
trade agreement for fewer collectives.

    def main(args, ctx):
        import tensorflow as tf
        strategy = tf.distribute.MultiWorkerMirroredStrategy()   # first: it sets up collectives
        from duotf.averaging import WeightAverager
        variables = ...                   # this worker's model, made outside strategy.scope()
        averager = WeightAverager(variables, every=10, strategy=strategy)
        averager.start()                  # every worker starts from the same weights
        for batch in feed.dataset(64):
            train_step(batch)             # local: no collective
            averager.step()               # every 10th call: average with the other workers
        averager.finish()                 # leave: the last average, once every worker is done

    # Keras: model.fit(ds, callbacks=[duotf.averaging.AveragingCallback(every=10, strategy=strategy)])

**The average is one TF collective**: the weights, flattened into one vector with a count of
the workers still training, are summed by ``MultiWorkerMirroredStrategy``'s all-reduce (ring
or tree over the workers' own gRPC servers, in TF's runtime). Not duotf's rendezvous channel:
that channel goes through the driver, a JSON message per node, and would put every round's
weights through one process; the collective stays between the workers.

**The end of data never hangs**: the all-reduce needs every worker, so a worker that runs out
of data first calls :meth:`WeightAverager.finish`, which keeps joining the rounds of the
workers still training (counted as not training: its weights stop counting, and it adopts the
average of those that train) until every worker has finished; then all of them take the plain
average once and return, with equal weights. With duotf's balanced feed (``cluster.train``,
the default ``balance=True``) every worker takes the same steps and ``finish`` is one round.
A worker that fails while others wait in a round fails the cluster as any node does (duotf
stops every node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Union

from duotf._names import lazy as _lazy
from duotf.errors import ConfigError

if TYPE_CHECKING:  # TensorFlow is imported where it is used
    import tensorflow as tf

# AveragingCallback too, made on first use (module __getattr__): its base class is Keras's
__all__ = ["WeightAverager"]


class WeightAverager:
    """Average ``variables`` across the workers every ``every`` calls of :meth:`step`.

    Parameters
    ----------
    variables:
        This worker's variables (``tf.Variable`` or Keras variables, made outside any strategy
        scope: they are the worker's own), or a callable returning them (read at
        :meth:`start`). Every worker must give variables of the same shapes, in one order.
        Those of a floating dtype are averaged (in float32); others (counters, a random
        generator's state) are left as they are.
    every:
        The averaging interval in steps (``sync_interval``), an int >= 1.
    strategy:
        A ``tf.distribute.MultiWorkerMirroredStrategy``, made first in ``main`` (TF sets up
        collectives only before other ops run); ``None`` makes one, so construct the averager
        before any other TF work then.
    """

    def __init__(self, variables: Union[Sequence, Callable[[], Sequence]], every: int,
                 strategy: Optional[tf.distribute.Strategy] = None):
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ConfigError(f"WeightAverager: every must be an int >= 1, got {every!r}")
        import tensorflow as tf

        if strategy is None:
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
        elif not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            raise ConfigError(f"WeightAverager averages over a MultiWorkerMirroredStrategy's "
                              f"collectives, not a {type(strategy).__name__}")
        self.every = every
        self.strategy = strategy
        self.steps = 0  #: calls of step() so far
        self.rounds = 0  #: averages taken part in (start, step, finish)
        self.finished = False
        self._source = variables
        self._variables: Optional[List] = None
        self._weighted: Optional[Callable] = None
        self._mean: Optional[Callable] = None

    # -- the rounds ---------------------------------------------------------------------------
    def _build(self) -> None:
        import tensorflow as tf

        source = self._source() if callable(self._source) else self._source
        # floating variables only: a counter or a random generator's state is no weight
        variables = [v for v in map(_tf_variable, source) if v.dtype.is_floating]
        if not variables:
            raise ConfigError("WeightAverager: no variables to average")
        self._variables = variables
        strategy = self.strategy
        sizes = [int(v.shape.num_elements()) for v in variables]
        dtype = tf.float32

        def flat():
            return tf.concat([tf.reshape(tf.cast(v, dtype), [-1]) for v in variables], 0)

        def assign(vector):
            for v, part in zip(variables, tf.split(vector, sizes)):
                v.assign(tf.cast(tf.reshape(part, v.shape), v.dtype))

        @tf.function(input_signature=[tf.TensorSpec([], dtype)])
        def weighted(active):
            def replica_fn(active):
                ctx = tf.distribute.get_replica_context()
                packed = tf.concat([flat() * active, tf.reshape(active, [1])], 0)
                total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, packed)
                training = total[-1]
                tf.cond(training > 0, lambda: assign(total[:-1] / training) or tf.no_op(),
                        tf.no_op)
                return training

            return strategy.experimental_local_results(strategy.run(replica_fn, args=(active,)))[0]

        @tf.function
        def mean():
            def replica_fn():
                ctx = tf.distribute.get_replica_context()
                assign(ctx.all_reduce(tf.distribute.ReduceOp.MEAN, flat()))
                return tf.constant(0.0)

            return strategy.experimental_local_results(strategy.run(replica_fn))[0]

        self._weighted, self._mean = weighted, mean

    def _round(self, training: bool) -> float:
        import tensorflow as tf

        if self._weighted is None:
            self._build()
        weighted = self._weighted
        assert weighted is not None  # _build sets it
        self.rounds += 1
        return float(weighted(tf.constant(1.0 if training else 0.0)))

    # -- the user's calls -----------------------------------------------------------------------
    def start(self) -> None:
        """Average once before training: every worker starts from the same weights."""
        self._check_open("start")
        self._round(True)

    def step(self) -> bool:
        """Count a training step; every ``every``-th, average with the other workers. Returns
        whether this call averaged."""
        self._check_open("step")
        self.steps += 1
        if self.steps % self.every:
            return False
        self._round(True)
        return True

    def finish(self) -> int:
        """This worker has no more data: join the other workers' rounds until every worker
        finished, then take the plain average with all of them. Returns the rounds joined
        here. Idempotent."""
        if self.finished:
            return 0
        joined = 0
        while True:
            joined += 1
            if self._round(False) == 0:  # nobody trains any more: the same answer everywhere
                break
        assert self._mean is not None  # the rounds above built it
        self._mean()
        self.rounds += 1
        self.finished = True
        return joined + 1

    def _check_open(self, what: str) -> None:
        if self.finished:
            raise RuntimeError(f"WeightAverager.{what}() after finish(): the other workers "
                               "no longer average with this one")


def _tf_variable(variable):
    """A Keras 3 variable's ``tf.Variable`` (``.value``), or ``variable`` itself."""
    import tensorflow as tf

    if isinstance(variable, tf.Variable):
        return variable
    inner = getattr(variable, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    raise ConfigError(f"WeightAverager averages tf.Variables or Keras variables, not "
                      f"{type(variable).__name__}")


_CALLBACK = None


def _callback_class():
    """``AveragingCallback``, made on first use: its base class is Keras's, and importing this
    module imports no Keras."""
    global _CALLBACK
    if _CALLBACK is not None:
        return _CALLBACK
    import keras

    class AveragingCallback(keras.callbacks.Callback):
        """Average the model's weights across the workers every ``every`` training batches of
        ``fit`` (a :class:`WeightAverager` of ``model.weights``): once before the first batch,
        every ``every`` batches, and at the end of ``fit`` (until every worker's ``fit``
        ended). Compile and fit the model outside any strategy scope: each worker trains its
        own copy. ``averager`` is the :class:`WeightAverager` of the last ``fit`` (``steps``,
        ``rounds``); every worker must call ``fit`` as many times.

        Parameters
        ----------
        every:
            The averaging interval in batches.
        strategy:
            A ``MultiWorkerMirroredStrategy`` made first in ``main`` (``None``: one is made).
        """

        def __init__(self, every: int, strategy: Optional[tf.distribute.Strategy] = None):
            super().__init__()
            self.averager = WeightAverager(lambda: self.model.weights, every, strategy)
            self.every, self.strategy = every, self.averager.strategy

        def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
            if self.averager.finished:  # a later fit: averaged anew (on every worker alike)
                self.averager = WeightAverager(lambda: self.model.weights, self.every,
                                               self.strategy)
            self.averager.start()

        def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
            self.averager.step()

        def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
            self.averager.finish()

    _CALLBACK = AveragingCallback
    return _CALLBACK


__getattr__, __dir__ = _lazy(__name__, {"AveragingCallback": _callback_class})
