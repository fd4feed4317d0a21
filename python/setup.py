"""Builds the gradsync wheel: the Python package plus the native library
and programs it runs (built with Bazel from the checkout this file is in,
or taken from GRADSYNC_BAZEL_BIN, a folder laid out as bazel-bin/)."""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Built file (under bazel-bin/) -> its place in the package. The launcher
# finds the server as ../server/gradsync_server from its own folder.
NATIVE = {
    "python/libgradsync.so": "libgradsync.so",
    "launcher/gradsync_launch": "_bin/launcher/gradsync_launch",
    "server/gradsync_server": "_bin/server/gradsync_server",
    "wire/gradsync_keygen": "_bin/wire/gradsync_keygen",
}
TARGETS = ["//python:libgradsync.so", "//launcher:gradsync_launch",
           "//server:gradsync_server", "//wire:gradsync_keygen"]


def _built_files():
    """The folder holding NATIVE's files: GRADSYNC_BAZEL_BIN, or the
    checkout's bazel-bin/ after `bazel build` brought it up to date."""
    given = os.environ.get("GRADSYNC_BAZEL_BIN")
    if given:
        return given
    if not os.path.exists(os.path.join(ROOT, "WORKSPACE")):
        raise SystemExit("gradsync: %s is not a gradsync checkout; set "
                         "GRADSYNC_BAZEL_BIN to a folder of built files" % ROOT)
    subprocess.check_call(["bazel", "build"] + TARGETS,
                          cwd=ROOT)
    return os.path.join(ROOT, "bazel-bin")


class BuildWithNative(build_py):
    def run(self):
        super().run()
        source = _built_files()
        for built, placed in NATIVE.items():
            path = os.path.join(source, built)
            if not os.path.isfile(path):
                raise SystemExit("gradsync: %s is missing" % path)
            target = os.path.join(self.build_lib, "gradsync", placed)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(path, target)
            os.chmod(target, 0o755)


setup(cmdclass={"build_py": BuildWithNative})
