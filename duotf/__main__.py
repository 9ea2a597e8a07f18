"""``python -m duotf doctor|run ...`` (see :mod:`duotf._driver.cli`).

Also runnable by its path, as ``spark-submit`` runs a file: its folder is then first on
``sys.path``, where duotf's own modules (``dask.py``, ``keras.py``) would hide the packages of
those names, so the package's parent folder takes its place.
"""

import os
import sys

if not __package__:
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

from duotf._driver.cli import main  # noqa: E402  (after the path is right)

if __name__ == "__main__":
    sys.exit(main())
