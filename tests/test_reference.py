"""The reference covers every public name: the docs site is built as CI builds it, and every
name of each public module's ``__all__`` (with ``duotf.spark``'s lazy ``TFEstimator`` and
``TFModel``, and the ``DataFeed`` that ``ctx.get_data_feed`` returns), and every public method
a duotf class defines, has an entry in the site's inventory (``objects.inv``, what
mkdocstrings renders and cross-references resolve to)."""

from __future__ import annotations

import importlib
import inspect
import os
import pathlib
import re
import subprocess
import sys
import zlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# one worker builds the site once for every case (the fixture is the module's: each worker that
# ran a case built it again, 25-50 s of CPU each)
pytestmark = pytest.mark.xdist_group("reference")

#: the modules users import names from (docs/reference/)
PUBLIC = ["duotf", "duotf.errors", "duotf.spec", "duotf.reports", "duotf.context", "duotf.keras",
          "duotf.averaging", "duotf.spark", "duotf.dask", "duotf.io", "duotf.io.tfrecord",
          "duotf.io.tfdata", "duotf.io.dataframe", "duotf.io.example", "duotf.backends",
          "duotf.testing"]
#: names users reach that no ``__all__`` lists: module -> names
REACHED = {"duotf.spark": ["TFEstimator", "TFModel"],  # lazy: import * would import pyspark
           "duotf._transport.datafeed": ["DataFeed"]}  # what ctx.get_data_feed returns


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert done.returncode == 0, f"mkdocs build failed (pip install -e '.[docs]'):\n{done.stderr[-3000:]}"
    return site


@pytest.fixture(scope="module")
def inventory(site) -> set:
    data = (site / "objects.inv").read_bytes()
    body = data.split(b"zlib.\n", 1)[1]
    return {line.split()[0] for line in zlib.decompress(body).decode().splitlines() if line.strip()}


def public_names():
    """``(module, name, object)`` of every public name."""
    for module in PUBLIC + list(REACHED):
        mod = importlib.import_module(module)
        names = (list(getattr(mod, "__all__", [])) if module in PUBLIC else []) + REACHED.get(module, [])
        for name in names:
            yield module, name, getattr(mod, name)


def _resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def defined_at(obj, inventory: set) -> set:
    """The entries of the inventory that are ``obj``, under any path: its ``__module__`` (a
    public class's says where users import it: duotf._names.public) or the module that defines
    it, where the reference's renderer lists it."""
    qualname = getattr(obj, "__qualname__", None)
    if not (getattr(obj, "__module__", None) and qualname):
        return set()
    paths = {f"{obj.__module__}.{qualname}"}
    for entry in inventory:
        if entry.startswith("duotf") and entry.endswith(f".{qualname}") and entry not in paths:
            try:
                if _resolve(entry[:-len(qualname) - 1], qualname) is obj:
                    paths.add(entry)
            except (ImportError, AttributeError):
                continue
    return paths


def documented(inventory: set, module: str, name: str, obj) -> bool:
    """Whether ``obj``, reached as ``module.name``, has an entry: under that path or where it is
    defined."""
    return bool(({f"{module}.{name}"} | defined_at(obj, inventory)) & inventory)


def test_every_public_name_is_in_the_reference(inventory):
    missing = [f"{module}.{name}" for module, name, obj in public_names()
               if not documented(inventory, module, name, obj)]
    assert not missing, f"not in the reference (docs/reference/): {missing}"


def test_every_public_method_of_a_duotf_class_is_in_the_reference(inventory):
    missing = []
    for module, name, obj in public_names():
        if not inspect.isclass(obj) or not obj.__module__.startswith("duotf"):
            continue
        heads = {p for p in {f"{module}.{name}"} | defined_at(obj, inventory) if p in inventory}
        for attr, value in vars(obj).items():
            if attr.startswith("_") or not (inspect.isfunction(value) or isinstance(value, property)):
                continue
            if getattr(value, "__qualname__", "").startswith("_accessors."):
                # Spark ML's setX/getX of a parameter: the class's text names the parameter
                doc, param = inspect.getdoc(obj), attr[3].lower() + attr[4:]
                if f"``{param}``" in doc and "``setX``/``getX``" in doc:
                    continue
            if not any(f"{head}.{attr}" in inventory for head in heads):
                missing.append(f"{module}.{name}.{attr}")
    assert not missing, f"not in the reference (docs/reference/): {sorted(set(missing))}"


def test_no_sphinx_role_shows_as_raw_text(site):
    """The docstrings' Sphinx roles (:class:`Cluster`) become links or code on the site
    (docs/ext/sphinx_roles.py): none is left as the text a reader would see raw."""
    raw = {}
    for page in sorted(site.rglob("*.html")):
        found = re.findall(r":(?:class|func|meth|mod|data|attr|exc|obj|const):(?:`|<code>)", page.read_text())
        if found:
            raw[str(page.relative_to(site))] = len(found)
    assert not raw, f"raw Sphinx roles on the site (page: count): {raw}"


def test_a_role_becomes_a_link_to_the_object_it_names(site):
    """One role of each kind, resolved in its docstring's scope: ``:meth:`train``` in
    Cluster's docstring links to ``Cluster.train``."""
    page = (site / "reference" / "duotf" / "index.html").read_text()
    links = re.findall(r'<a class="autorefs autorefs-internal"[^>]*href="([^"]+)"', page)
    assert "#duotf.Cluster.train" in links or "#duotf._driver.cluster.Cluster.train" in links, links[:50]
