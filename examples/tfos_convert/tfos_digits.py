"""Digits on a TensorFlow cluster that Spark feeds, as a TensorFlowOnSpark program has it.

tfos_digits.py is the TensorFlowOnSpark (TFoS) program, InputMode.SPARK: the driver starts the
cluster with TFCluster.run, pushes an RDD of (features, label) rows with cluster.train and
stops with cluster.shutdown; main_fun(args, ctx) runs on every executor and reads its rows
with a DataFeed's next_batch until should_stop(). duotf_digits.py is the same program
converted to duotf: three lines differ, where the two APIs do (docs/CONVERTING.md).

    spark-submit tfos_digits.py --cluster-size 2     # with TFoS: --py-files tfspark.zip
    spark-submit duotf_digits.py --cluster-size 2
"""

import argparse
import os

import numpy as np
from pyspark.sql import SparkSession
from tensorflowonspark import TFCluster, TFNode


def main_fun(args, ctx):
    """One worker of a MultiWorkerMirroredStrategy: SGD on its share of each global batch."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    per_worker = args.batch_size // ctx.num_workers
    with strategy.scope():
        init = tf.keras.initializers.GlorotUniform(seed=args.seed)
        total = tf.VariableAggregation.SUM
        weights = [tf.Variable(init([64, 64]), aggregation=total),
                   tf.Variable(tf.zeros([64]), aggregation=total),
                   tf.Variable(init([64, 10]), aggregation=total),
                   tf.Variable(tf.zeros([10]), aggregation=total)]

    def logits(x):
        hidden = tf.nn.relu(tf.matmul(x, weights[0]) + weights[1])
        return tf.matmul(hidden, weights[2]) + weights[3]

    @tf.function
    def step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits(x)))
                loss = loss / args.batch_size
            for w, g in zip(weights, tape.gradient(loss, weights)):
                w.assign_sub(args.lr * g)  # summed over the replicas: one global SGD step
            return loss

        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    # Synchronous replicas must take the same number of steps, and Spark's partitions need
    # not share the rows evenly among the workers: stop at 90% of the steps the data holds.
    max_steps = int(0.9 * args.rows * args.epochs / args.batch_size)
    feed = TFNode.DataFeed(ctx.mgr, True)
    steps = 0
    while not feed.should_stop() and steps < max_steps:
        batch = feed.next_batch(per_worker)
        if len(batch) == 0:
            continue
        x = np.array([row[0] for row in batch], dtype=np.float32)
        y = np.array([row[1] for row in batch], dtype=np.int64)
        loss = step(x, y)
        steps += 1
        if steps % 50 == 0 and ctx.task_index == 0:
            print(f"step {steps}: loss {float(loss):.4f}", flush=True)
    feed.terminate()  # the rows left are not needed: Spark skips the partitions still to feed

    if ctx.task_index == 0:  # worker 0 saves the weights
        model_dir = ctx.absolute_path(args.model_dir)
        os.makedirs(model_dir, exist_ok=True)
        np.savez(os.path.join(model_dir, "weights.npz"), *[w.numpy() for w in weights])


def digits(seed=0):
    """scikit-learn's 8x8 digits (shipped with it) scaled to [0, 1]: train and test splits."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    test = order[:len(x) // 5]
    train = order[len(x) // 5:]
    return x[train], y[train], x[test], y[test]


def accuracy(model_dir, x, y):
    """The saved weights' accuracy on (x, y), on the driver."""
    with np.load(os.path.join(model_dir, "weights.npz")) as saved:
        w1, b1, w2, b2 = (saved[f"arr_{i}"] for i in range(4))
    hidden = np.maximum(x @ w1 + b1, 0)
    return float(np.mean(np.argmax(hidden @ w2 + b2, axis=1) == y))


def train(sc, args):
    """Train on sc's executors; return the test accuracy."""
    x, y, x_test, y_test = digits()
    args.rows = len(x)
    rows = sc.parallelize([(row.tolist(), int(label)) for row, label in zip(x, y)],
                          args.partitions)
    cluster = TFCluster.run(sc, main_fun, args, args.cluster_size, 0, args.tensorboard, TFCluster.InputMode.SPARK)
    cluster.train(rows, args.epochs)
    cluster.shutdown()
    return accuracy(args.model_dir, x_test, y_test)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster-size", type=int, default=2, help="TF workers (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the rows (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="initialisation seed (default: %(default)s)")
    parser.add_argument("--partitions", type=int, default=4, help="RDD partitions (default: %(default)s)")
    parser.add_argument("--model-dir", default=os.path.abspath("digits_model"),
                        help="where worker 0 saves weights.npz (default: %(default)s)")
    parser.add_argument("--tensorboard", action="store_true", help="start TensorBoard (default: off)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    spark = SparkSession.builder.appName("digits").getOrCreate()
    args = parse()
    print(f"test accuracy: {train(spark.sparkContext, args):.4f}")
