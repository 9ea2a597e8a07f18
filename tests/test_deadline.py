"""The one deadline type every bounded wait uses."""

import time

from duotf._deadline import Deadline


def test_a_deadline_counts_down_and_expires():
    d = Deadline.after(0.05)
    assert 0 < d.remaining <= 0.05 and not d.expired
    assert abs(d.duration - 0.05) < 1e-9
    end = time.monotonic() + 5
    while not d.expired and time.monotonic() < end:
        time.sleep(0.005)
    assert d.expired and d.remaining == 0.0 and d.elapsed >= 0.05


def test_never_expires_and_sooner_takes_the_earlier_bound():
    never = Deadline.after(None)
    assert never.remaining is None and not never.expired and never.duration is None
    assert "never" in repr(never)
    soon = never.sooner(10)
    assert 9 < soon.remaining <= 10
    assert soon.sooner(100) is soon  # the later bound changes nothing
    assert soon.sooner(None) is soon
    assert soon.sooner(0.01).remaining <= 0.01
    assert Deadline.after(-3).remaining == 0.0  # a negative wait is already over
