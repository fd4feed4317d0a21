"""The programs installed with the package (gradsync-launch,
gradsync-server, gradsync-keygen): each runs the native program bundled in
the package with the same arguments."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _run(relative):
    path = os.path.join(_HERE, "_bin", relative)
    if not os.access(path, os.X_OK):
        sys.exit("gradsync: %s is missing; reinstall the package" % path)
    os.execv(path, [path] + sys.argv[1:])


def launch():
    _run("launcher/gradsync_launch")


def server():
    _run("server/gradsync_server")


def keygen():
    _run("wire/gradsync_keygen")
