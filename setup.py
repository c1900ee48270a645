"""Maps the top-level folders onto the twinserve namespace (the rest lives in pyproject.toml).

core/, backends/, sim/, kernels/, twin/ and bench/ install as twinserve.core, twinserve.backends,
twinserve.sim, twinserve.kernels, twinserve.twin and twinserve.bench, so nothing named `core` or `kernels` lands in a
user's environment. Subpackages are discovered, so a new folder needs no edit here; folders that
hold only data (sim/data, backends/sim/models, backends/sim/profiles) are declared as packages too,
so setuptools installs their files (pyproject's package-data) without a "Package would be ignored"
warning for each.
"""

from setuptools import find_namespace_packages, setup

FOLDERS = ("core", "backends", "sim", "kernels", "twin", "bench")

package_dir = {"twinserve": "twinserve"}
packages = ["twinserve"]
for folder in FOLDERS:
    package_dir[f"twinserve.{folder}"] = folder
    packages.append(f"twinserve.{folder}")
    packages += [f"twinserve.{folder}.{sub}" for sub in find_namespace_packages(folder, exclude=["*__pycache__*"])]

setup(package_dir=package_dir, packages=packages)
