"""The node's shuffling windows (duotf._transport.shuffle.Windows), column kinds and cuts."""

import numpy as np

from duotf._transport import shuffle
from duotf._transport.columns import RaggedColumn, num_rows


def _frame(start: int, stop: int):
    ids = np.arange(start, stop)
    lengths = ids % 3
    splits = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=splits[1:])
    values = np.concatenate([np.full(n, i, dtype=np.float32) for i, n in zip(ids, lengths)])
    return {"id": ids, "x": np.stack([ids, -ids], axis=1), "r": RaggedColumn(values, splits),
            "s": [f"row {i}" for i in ids]}


def test_windows_permute_fixed_runs_of_rows_whatever_the_frames_and_keep_rows_whole():
    key = [5, 2, 1, 7]  # seed 5, epoch 2, target 1, windows of 7 rows
    out = []
    windows = shuffle.Windows()
    for start, stop in [(0, 3), (3, 4), (4, 19), (19, 20)]:  # cuts unlike the windows'
        out += windows.add(_frame(start, stop), key)
    assert [num_rows(w) for w in out] == [7, 7]
    out += windows.flush()
    assert [num_rows(w) for w in out] == [7, 7, 6] and windows.held == 0
    ids = np.concatenate([w["id"] for w in out])
    expected = np.concatenate([np.arange(k * 7, min(20, k * 7 + 7))[
        shuffle.permutation(key, k, min(7, 20 - k * 7))] for k in range(3)])
    assert ids.tolist() == expected.tolist() and sorted(ids.tolist()) == list(range(20))
    assert ids.tolist() != list(range(20))
    for w in out:  # every column of a row moved with it
        assert (w["x"][:, 0] == w["id"]).all() and (w["x"][:, 1] == -w["id"]).all()
        assert w["s"] == [f"row {i}" for i in w["id"]]
        assert [row.tolist() for row in w["r"]] == [[float(i)] * (i % 3) for i in w["id"]]


def test_the_next_epoch_counts_windows_from_zero_with_its_own_key():
    windows = shuffle.Windows()
    first = windows.add(_frame(0, 4), [1, 1, 0, 4])
    again = windows.add(_frame(0, 4), [1, 1, 0, 4])
    windows.flush()
    second = windows.add(_frame(0, 4), [1, 2, 0, 4])
    assert first[0]["id"].tolist() != list(range(4)) or second[0]["id"].tolist() != list(range(4))
    assert first[0]["id"].tolist() == np.arange(4)[shuffle.permutation([1, 1, 0], 0, 4)].tolist()
    assert again[0]["id"].tolist() == np.arange(4)[shuffle.permutation([1, 1, 0], 1, 4)].tolist()
    assert second[0]["id"].tolist() == np.arange(4)[shuffle.permutation([1, 2, 0], 0, 4)].tolist()


def test_a_default_window_holds_about_30_mib_of_rows_by_their_types():
    cols = {"x": np.zeros((3, 784), dtype=np.float32), "y": np.zeros(3, dtype=np.int64)}
    assert shuffle.window_rows(cols) == (30 << 20) // (784 * 4 + 8) == 10_005


def test_shuffle_settings_are_checked_and_a_drawn_seed_is_logged(caplog):
    import logging

    import pytest

    from duotf._driver.planner import shuffle_seed
    from duotf.errors import ConfigError

    assert shuffle_seed(False, None, None) is None and shuffle_seed(True, 3, 10) == 3
    for args, words in [((False, 3, None), "seed=3 without shuffle=True"),
                        ((False, None, 100), "shuffle_buffer=100"),
                        ((True, None, 0), "shuffle_buffer=0"),
                        ((True, -1, None), "seed=-1"),
                        (("yes", None, None), "shuffle='yes'")]:
        with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
            shuffle_seed(*args)
    with caplog.at_level(logging.INFO, logger="duotf.feed"):
        seed = shuffle_seed(True, None, None)
    assert isinstance(seed, int) and f"seed={seed}" in caplog.text


def test_initial_epoch_is_checked_against_the_epochs():
    import pytest

    from duotf._driver.planner import check_feed_args
    from duotf.errors import ConfigError

    check_feed_args(5, 60.0, None, 4)
    for bad in (5, -1, True, 1.0):
        with pytest.raises(ConfigError, match=r"initial_epoch=.*give the epochs done, 0 to 4"):
            check_feed_args(5, 60.0, None, bad)
