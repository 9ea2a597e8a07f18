"""The extras in setup.cfg install what the code needs: ``[spark]`` a working Spark feed
(``mapInArrow`` needs pyarrow, the feed pandas), the TensorFlow extras the Keras that
``duotf.keras`` patches, and every library whose internals duotf touches with an upper bound.

Read from setup.cfg with configparser (nothing is built or imported), so the test is quick.
``.ci/wheel-check`` installs the built wheel with these extras and runs an example.
"""

from __future__ import annotations

import configparser
import os
from importlib import metadata
from typing import Dict, List

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Libraries duotf reaches into (private attributes, internal modules, the jar against Spark's
#: internal classes): each must be capped wherever an extra declares it (setup.cfg says which
#: internals each cap protects).
INTERNALS_TOUCHED = ("pyspark", "tensorflow", "tensorflow-cpu", "keras", "dask", "distributed")


def _extras() -> Dict[str, List[Requirement]]:
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    extras = {}
    for name, value in config["options.extras_require"].items():
        lines = [line.strip() for line in value.splitlines()]
        extras[canonicalize_name(name)] = [Requirement(line) for line in lines if line and not line.startswith("#")]
    return extras


def _find(extra: str, package: str) -> Requirement:
    found = [r for r in _extras()[extra] if canonicalize_name(r.name) == package]
    assert found, f"the [{extra}] extra does not declare {package}"
    return found[0]


def _has_upper_bound(req: Requirement) -> bool:
    return any(s.operator in ("<", "<=", "==", "~=", "===") for s in req.specifier)


def test_spark_extra_brings_what_the_spark_feed_needs():
    arrow = _find("spark", "pyarrow")
    assert arrow.specifier.contains("18.0") and not arrow.specifier.contains("17.0"), (
        f"[spark] needs pyarrow>=18 (pyspark 4's Arrow paths), got {arrow}")
    _find("spark", "pandas")
    _find("spark", "pyspark")


def test_spark_provided_is_the_spark_extra_less_pyspark():
    """Installed beside a cluster's own Spark, duotf must not pull a pyspark of its own (one
    that differs from the cluster's Spark), and must still bring what the feed needs."""
    spark = {canonicalize_name(r.name): r for r in _extras()["spark"]}
    provided = {canonicalize_name(r.name): r for r in _extras()["spark-provided"]}
    assert "pyspark" not in provided
    assert {name: str(r) for name, r in provided.items()} == {
        name: str(r) for name, r in spark.items() if name != "pyspark"}


@pytest.mark.parametrize("extra", ["tensorflow", "tensorflow-cpu"])
def test_tensorflow_extras_declare_the_keras_duotf_keras_patches(extra):
    keras = _find(extra, "keras")
    assert _has_upper_bound(keras), f"[{extra}]: {keras} has no upper bound (duotf.keras patches its internals)"
    from duotf.keras import TESTED_KERAS

    assert keras.specifier.contains(f"{TESTED_KERAS}.0"), (
        f"[{extra}]: {keras} excludes Keras {TESTED_KERAS}, the one duotf.keras is tested with")


def test_libraries_whose_internals_duotf_touches_are_capped():
    uncapped = [f"[{extra}] {req}" for extra, reqs in _extras().items() for req in reqs
                if canonicalize_name(req.name) in INTERNALS_TOUCHED and not _has_upper_bound(req)]
    assert not uncapped, f"no upper bound on a library whose internals duotf touches: {uncapped}"


def test_the_installed_versions_are_within_the_declared_ranges():
    """The versions tested here (installed) are ones the extras allow."""
    outside = []
    for extra, reqs in _extras().items():
        for req in reqs:
            try:
                version = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                continue
            if not req.specifier.contains(version, prereleases=True):
                outside.append(f"[{extra}] {req}: {version} installed")
    assert not outside, f"installed versions outside setup.cfg's ranges: {outside}"


def test_the_install_page_names_this_version_and_tested_versions_the_extras_allow():
    """docs/install.md's wheel name is this version's, and every package's "Tested" version in
    its table is one the extras allow."""
    from duotf._version import __version__

    with open(os.path.join(ROOT, "docs", "install.md"), encoding="utf-8") as f:
        page = f.read()
    assert f"dist/duotf-{__version__}-py3-none-any.whl[" in page
    declared = {canonicalize_name(r.name): r for reqs in _extras().values() for r in reqs}
    checked = []
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and canonicalize_name(cells[0]) in declared and cells[1][:1].isdigit():
            req = declared[canonicalize_name(cells[0])]
            assert req.specifier.contains(cells[1], prereleases=True), (
                f"docs/install.md says {cells[0]} {cells[1]} is tested, but setup.cfg allows {req}")
            checked.append(cells[0])
    assert {"pyspark", "Keras", "tensorflow-cpu", "dask"} <= set(checked), checked
