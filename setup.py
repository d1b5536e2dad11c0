"""Package layout the TOML cannot express: the project's top-level ``configs/`` ships inside the wheel as
``rt/configs`` (the simulated hardware that ``rt.init()`` reads), so a regular ``pip install .`` works as well
as an editable one. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["rt*", "hccl*", "launcher*", "acl*", "torch_npu*"]) + ["rt.configs"],
    package_dir={"rt.configs": "configs"},
    package_data={"rt.configs": ["*.toml"], "torch_npu": ["*.cpp"]},
)
