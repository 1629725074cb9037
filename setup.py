"""Maps the repository's top-level layer folders into the one `gpuflow` namespace.

The design keeps hardware/, tasks/, flows/ and blocks/ at the top of the repository, but a
wheel must not add `hardware` or `tasks` to site-packages as top-level names. setuptools'
package_dir installs each folder as a subpackage (hardware/ -> gpuflow.hardware); editable
installs get the same mapping through setuptools' import finder. Everything else (metadata,
dependencies, package data) is in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

LAYERS = ("hardware", "tasks", "flows", "blocks")

package_dir = {"gpuflow": "gpuflow"}
# Namespace discovery so that data folders (gpuflow/data, hardware/data) are packages too.
packages = find_namespace_packages(include=["gpuflow", "gpuflow.*"], exclude=["*__pycache__*"])
for layer in LAYERS:
    package_dir[f"gpuflow.{layer}"] = layer
    packages.append(f"gpuflow.{layer}")
    packages += [
        f"gpuflow.{layer}.{sub}"
        for sub in find_namespace_packages(where=layer, exclude=["*__pycache__*"])
    ]

setup(packages=packages, package_dir=package_dir)
