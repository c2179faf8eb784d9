"""The interpreter of Spark's Python workers (spark_runtime/python_worker.py): the zips of the
installed PySpark leave the path, everything else stays, and the script execs Python with
Spark's arguments."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

from spark_runtime.config import WORKER_PYTHON_SCRIPT, worker_python
from spark_runtime.python_worker import worker_pythonpath


def fake_site_packages(root, py4j_installed="0.10.9.9"):
    """A site-packages with an installed PySpark (its bundled zips inside) and py4j."""
    site = root / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    (lib / "pyspark.zip").write_bytes(b"")
    (lib / "py4j-0.10.9.9-src.zip").write_bytes(b"")
    (site / "py4j").mkdir()
    (site / f"py4j-{py4j_installed}.dist-info").mkdir()
    return site, lib


def test_the_bundled_zips_leave_the_path_and_the_rest_stays_in_order(tmp_path):
    site, lib = fake_site_packages(tmp_path)
    path = os.pathsep.join(
        [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), "/jobs/a.zip", "/x"]
    )
    assert worker_pythonpath(path, str(site)) == os.pathsep.join(["/jobs/a.zip", "/x"])


def test_a_py4j_zip_of_another_version_than_the_installed_one_stays(tmp_path):
    site, lib = fake_site_packages(tmp_path, py4j_installed="0.10.9.7")
    path = os.pathsep.join([str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")])
    assert worker_pythonpath(path, str(site)) == str(lib / "py4j-0.10.9.9-src.zip")


def test_zips_of_a_spark_distribution_elsewhere_stay(tmp_path):
    site, _ = fake_site_packages(tmp_path)
    other = tmp_path / "spark-4.3.0" / "python" / "lib"
    other.mkdir(parents=True)
    path = os.pathsep.join([str(other / "pyspark.zip"), str(other / "py4j-0.10.9.9-src.zip")])
    assert worker_pythonpath(path, str(site)) == path


def test_the_installed_script_runs_this_python_with_sparks_arguments():
    """Run as Spark runs it: the real bundled zips first on PYTHONPATH, a module, arguments, an
    exit code and Spark's other variables; PySpark comes from site-packages."""
    script = worker_python()
    assert os.path.basename(script) == WORKER_PYTHON_SCRIPT, "pip install -e . installs it"
    site = sysconfig.get_paths()["purelib"]
    lib = os.path.join(site, "pyspark", "python", "lib")
    zips = sorted(os.path.join(lib, name) for name in os.listdir(lib) if name.endswith(".zip"))
    assert [os.path.basename(z) for z in zips][-1] == "pyspark.zip"
    code = (
        "import os, sys, pyspark, py4j; "
        "print(pyspark.__file__); print(py4j.__file__); print(os.environ['PYTHONPATH']); "
        "print(os.environ['PYTHONHASHSEED']); print(sys.argv[1:]); sys.exit(3)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*zips, "/jobs/a.zip"])}
    env["PYTHONHASHSEED"] = "0"
    done = subprocess.run(
        [script, "-c", code, "--flag", "x"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        os.path.join(site, "pyspark", "__init__.py"),
        os.path.join(site, "py4j", "__init__.py"),
        "/jobs/a.zip",
        "0",
        "['--flag', 'x']",
    ]
    # Without the wrapper the same path imports PySpark from the zip (what it fixes).
    plain = subprocess.run(
        [sys.executable, "-c", "import pyspark; print(pyspark.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ".zip" in plain.stdout, plain.stderr
