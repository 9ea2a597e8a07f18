"""The node programs of the shared suite (duotf.testing.suite.mains), for the tests outside it."""

from duotf.testing.suite.mains import *  # noqa: F401,F403
