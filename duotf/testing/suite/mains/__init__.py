"""Node programs (``main(args, ctx)``) and the functions the shared suite hands duotf, one module
per kind of test: ``training``, ``feeding``, ``models``, ``restarts``, ``hosts``. This package is pickled by
value (:mod:`duotf.testing.plugin` registers it with cloudpickle), so the executors of an engine
run them without importing it; ``python -m duotf run duotf.testing.suite.mains:argv_main`` finds
them by name here.
"""

from duotf.testing.suite.mains.training import (  # noqa: F401
    block_main, chief_blocks_main, describe_main, make_regression, mwms_linear, mwms_main, N_FEATURES,
    ps_between_graph_main, ps_chief_main, raise_on_main, read_shard_main, reference_weights,
    sleep_main, slow_save_main, wait_for_file,
)
from duotf.testing.suite.mains.feeding import (  # noqa: F401
    feed_columns_main, feed_dataset_main, feed_die_main, feed_hold_main, feed_infer_main, feed_infer_short_main,
    feed_memory_main, feed_ragged_main, feed_tensor_main, feed_terminate_main, feed_train_main,
    ids_seen_main, keras_columns_main, ragged_infer_main, sgd_main,
)
from duotf.testing.suite.mains.models import (  # noqa: F401
    argv_main, epoch_report_main, holdout_callbacks, infer_model, keras_fit_main, keras_linear, keras_predict_main,
    keras_unsupported_main, linear_model_fn, linear_train_fn, load_keras, report_main, RowSource,
    scoring_stats, started_train_fn, step_counter, talk_main, tensorboard_main, tracking_train_fn,
    trial_main, two_io_model_fn,
)
from duotf.testing.suite.mains.restarts import (  # noqa: F401
    always_exit_main, hold_after_epoch, ids_resume_main, keras_resume_main, mwms_resume_main, raise_main,
    save_then_fail_main, sgd_resume_main,
)
from duotf.testing.suite.mains.hosts import HostRows, allreduce_main, host_rows_main, listening_main  # noqa: F401
