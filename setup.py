"""Only what pyproject.toml cannot say: install `kernel_cache_intercept.pth` beside the packages.

Python runs a `.pth` line that starts with `import` at every interpreter start; ours does nothing but
read KERNEL_CACHE_INTERCEPT unless it is set (see kernel_cache/interception.py). A wheel carries it
through build_py; an editable install (`pip install -e`) through editable_wheel's install directory;
an sdist (`python -m build` builds the wheel from one) through build_py's source files, without which
the wheel built from it would fail to find the file.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "kernel_cache_intercept.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]

    def get_source_files(self):  # what sdist packs: the hook travels in it
        return [*super().get_source_files(), PTH]


class EditableWheelWithPth(editable_wheel):
    def _install_namespaces(self, installation_dir, pth_prefix):
        super()._install_namespaces(installation_dir, pth_prefix)
        self.copy_file(PTH, os.path.join(installation_dir, PTH), preserve_mode=0)


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
