"""Build the wheel of the Python package pg-fencing (clients/python) with setuptools' PEP 517
backend, and install it from that artifact into a directory of its own (a pure-Python wheel is
installed by unpacking it, as pip does), for tests/pyclient/run.sh.

  "$PY" tests/pyclient/build.py --out DIR      (DIR/dist: the wheel; DIR/site: installed)
"""
import argparse
import os
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The package's directory: the one folder of clients/ with a pyproject.toml.
SOURCE = next(os.path.dirname(p) for p in sorted(
    __import__("glob").glob(os.path.join(ROOT, "clients", "*", "pyproject.toml"))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dist = os.path.join(a.out, "dist")
    site = os.path.join(a.out, "site")
    os.makedirs(dist, exist_ok=True)
    os.makedirs(site, exist_ok=True)
    here = os.getcwd()
    os.chdir(SOURCE)
    try:
        from setuptools import build_meta

        name = build_meta.build_wheel(dist)
    finally:
        os.chdir(here)
        # setuptools leaves its build directories in the source tree
        for d in ("build", os.path.join("src", "pg_fencing.egg-info")):
            path = os.path.join(SOURCE, d)
            if os.path.isdir(path):
                import shutil

                shutil.rmtree(path)
    wheel = os.path.join(dist, name)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        if not any(n.startswith("pg_fencing/") for n in names) or not any(
                n.endswith(".dist-info/METADATA") for n in names):
            sys.exit(f"{wheel} lacks the package or its metadata: {names}")
        z.extractall(site)
    print(wheel)


if __name__ == "__main__":
    main()
