"""Installs the repository's top-level folders under one namespace, `intellect_protocol`.

The folders stay where they are (`shared/`, `node/`, ...), but site-packages gets only
`intellect_protocol.shared`, `intellect_protocol.node`, ...: no generic top-level name that could
shadow, or be shadowed by, another distribution's `shared` or `migrations`.
"""

from setuptools import find_packages, setup

NAMESPACE = "intellect_protocol"
FOLDERS = ("shared", "coordinator", "node", "validator", "trainer", "devnet", "migrations", "contracts")

# `intellect_protocol` itself is an implicit namespace package: it has no folder of its own.
packages = []
package_dir = {}
for folder in FOLDERS:
    packages += [f"{NAMESPACE}.{folder}"] + [f"{NAMESPACE}.{folder}.{sub}" for sub in find_packages(folder)]
    package_dir[f"{NAMESPACE}.{folder}"] = folder

setup(packages=packages, package_dir=package_dir)
