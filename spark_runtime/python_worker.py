"""The interpreter Spark starts for its Python workers (PYSPARK_PYTHON): this Python, without
the zipped copy of PySpark that Spark puts in front of every worker's path.

    backstop-python-worker -m pyspark.daemon ...   (Spark runs it; not meant to be run by hand)

Spark sets a Python worker's PYTHONPATH to `$SPARK_HOME/python/lib/pyspark.zip` and py4j's zip
first. From a zip, Python compiles every module from its source each time a process starts
(zipimport neither reads nor writes `__pycache__`), while a pip-installed PySpark is the same
package, compiled once at install. Measured here: the Python process of a streaming Python data
source (`pyspark.sql.streaming.python_streaming_source_runner`) takes 1.3 s of CPU to import
from the zip and 0.4 s from site-packages. Spark gives that process a fixed 10 s to connect back
when a query starts, and on a busy 2-core machine a new standby's query missed it (docs/
RELIABILITY.md). This wrapper drops the two zips when they belong to the PySpark installed
beside this interpreter (so `import pyspark` finds the same code, compiled) and execs Python with
the arguments Spark gave; every other path entry and variable is kept.
"""

from __future__ import annotations

import os
import sys
import sysconfig

# Where a pip-installed PySpark keeps the zips Spark puts on its workers' path.
BUNDLED_LIB = os.path.join("pyspark", "python", "lib")


def is_bundled_zip(entry: str, site_packages: str) -> bool:
    """Whether path entry `entry` is a zip bundled inside the PySpark installed in
    `site_packages` whose package is installed there too: PySpark's own (the same distribution),
    or py4j's of the same version as the installed py4j."""
    bundled = os.path.realpath(os.path.join(site_packages, BUNDLED_LIB))
    if os.path.realpath(os.path.dirname(entry)) != bundled:
        return False
    name = os.path.basename(entry)
    if name == "pyspark.zip":
        return os.path.isfile(os.path.join(site_packages, "pyspark", "__init__.py"))
    if name.startswith("py4j-") and name.endswith("-src.zip"):
        version = name.removeprefix("py4j-").removesuffix("-src.zip")
        return os.path.isdir(os.path.join(site_packages, f"py4j-{version}.dist-info"))
    return False


def worker_pythonpath(pythonpath: str, site_packages: str) -> str:
    """`pythonpath` (os.pathsep-separated) without the zips `is_bundled_zip` names, in order."""
    kept = [
        entry
        for entry in pythonpath.split(os.pathsep)
        if entry and not is_bundled_zip(entry, site_packages)
    ]
    return os.pathsep.join(kept)


def main() -> None:
    """Exec this interpreter with Spark's arguments and the filtered PYTHONPATH."""
    site_packages = sysconfig.get_paths()["purelib"]
    os.environ["PYTHONPATH"] = worker_pythonpath(os.environ.get("PYTHONPATH", ""), site_packages)
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])


if __name__ == "__main__":
    main()
