"""The plain data of the shared suite (duotf.testing.suite.data), for the tests outside it."""

from duotf.testing.suite.data import *  # noqa: F401,F403
