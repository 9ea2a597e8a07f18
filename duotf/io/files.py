"""Opening and listing files of any fsspec URL, with errors that say what to install or set."""

from __future__ import annotations

import os
from typing import IO, List, Optional, Sequence, Tuple, Union

import fsspec
from fsspec.implementations.local import LocalFileSystem

from duotf.errors import ConfigError

_HDFS_HELP = (
    "hdfs:// goes through pyarrow's HadoopFileSystem, which needs on every node: a Hadoop client "
    "(HADOOP_HOME), libhdfs.so (found through ARROW_LIBHDFS_DIR or $HADOOP_HOME/lib/native), "
    "Java (JAVA_HOME), and the Hadoop jars on the CLASSPATH (export "
    "CLASSPATH=$($HADOOP_HOME/bin/hadoop classpath --glob))"
)


def _translate(url: str, exc: BaseException) -> BaseException:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if url.startswith(("hdfs://", "viewfs://")):
        return ConfigError(f"cannot open {url}: {text}. {_HDFS_HELP}")
    if isinstance(exc, ImportError) or "Install" in text:
        return ConfigError(f"no filesystem for {url}: {text}")
    return exc


def filesystem(url: str, storage_options: Optional[dict] = None) -> Tuple[fsspec.AbstractFileSystem, str]:
    """``(fs, path)`` for ``url``, with a clear error when the scheme's package is missing."""
    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except (ImportError, OSError, ValueError) as exc:
        raise _translate(url, exc) from exc


def open_url(url: str, mode: str = "rb", storage_options: Optional[dict] = None) -> IO[bytes]:
    """An open binary file object for ``url`` (local path or any fsspec URL)."""
    fs, path = filesystem(url, storage_options)
    if "w" in mode and isinstance(fs, LocalFileSystem):
        # Object stores have no folders to make; a local writer gets its parent folder, and
        # only a writer: reading a missing file must not leave folders behind.
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        return fs.open(path, mode)
    except (ImportError, OSError) as exc:
        raise _translate(url, exc) from exc


def expand(urls: Union[str, Sequence[str]], storage_options: Optional[dict] = None) -> List[str]:
    """A sorted list of file URLs from a URL, a glob, a directory, or a list of those."""
    if isinstance(urls, str):
        urls = [urls]
    found: List[str] = []
    for url in urls:
        fs, path = filesystem(url, storage_options)
        if fsspec.core.has_magic(path):
            paths = sorted(fs.glob(path))
        elif fs.isdir(path):
            paths = sorted(p for p in fs.find(path) if not p.rsplit("/", 1)[-1].startswith(("_", ".")))
        else:
            paths = [path]
        found += [fs.unstrip_protocol(p) if "://" in url else p for p in paths]
    if not found:
        raise FileNotFoundError(f"no files match {list(urls)}")
    return found
