"""``python -m duotf.backends.spark.jvm [JAR]``: rebuild duotf's jar from its Java source (needs a JDK); into
the package's own ``duotf-jvm.jar`` unless another path is given."""

import sys
from pathlib import Path

from duotf.backends.spark.jvm import JAR, build

if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else JAR))
