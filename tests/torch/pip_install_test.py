"""`pip install` of torch 2.13.0 and the Python package into a fresh venv,
as a user does it (pip's own settings; torch pinned); then gradsync is used
from that venv alone: no PYTHONPATH, no GRADSYNC_LIBRARY, from another
directory, and its programs on the venv's PATH run a real job."""
import os
import shutil
import subprocess
import sys

import job

CLEAN = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "GRADSYNC_LIBRARY")
         and not k.startswith("GRADSYNC_")}
# Each rank joins through torch.distributed and all-reduces its rank + 1.
SCRIPT = """
import torch, torch.distributed as dist
import gradsync
dist.init_process_group("gradsync")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("SUM %d %s" % (dist.get_rank(), t.item()), flush=True)
dist.destroy_process_group()
"""


def copy_source(destination):
    """python/ of this checkout (package, setup.py, pyproject.toml), without
    the library Bazel put beside it."""
    source = os.path.join(job.ROOT, "python")
    shutil.copytree(source, destination, symlinks=False,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__",
                                                  "*.cc", "*.h", "BUILD"))


def run(argv, **kwargs):
    done = subprocess.run(argv, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=300, **kwargs)
    text = done.stdout.decode("utf-8", "replace")
    assert done.returncode == 0, "%s failed:\n%s" % (argv, text[-4000:])
    return text


def test_pip_install_into_a_fresh_venv_then_run_a_job(tmp_path):
    copy_source(tmp_path / "src")
    venv = tmp_path / "venv"
    # The interpreter the project's venv was made from, as a user's python3.
    base = getattr(sys, "_base_executable", None) or sys.executable
    run([base, "-m", "venv", str(venv)], env=CLEAN)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
           "--disable-pip-version-check"]
    run(pip + ["torch==2.13.0", "setuptools", "wheel"], env=CLEAN)
    # The native files come from this build (Bazel's runfiles) rather than
    # from a nested Bazel build.
    env = dict(CLEAN, GRADSYNC_BAZEL_BIN=job.ROOT, PIP_NO_CACHE_DIR="1")
    run(pip + ["--no-index", "--no-build-isolation", "--no-deps",
               str(tmp_path / "src")], env=env)
    out = run([str(venv / "bin" / "python"), "-c",
               "import importlib.metadata as m; print(m.requires('gradsync'))"],
              env=CLEAN)
    assert "torch>=2.13" in out, out

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run([str(venv / "bin" / "python"), "-c",
               "import gradsync, gradsync.torch; print(gradsync.__version__);"
               "print(gradsync.__file__); print(gradsync._lib.lib()._name)"],
              env=CLEAN, cwd=str(elsewhere))
    version, module, library = out.split()[-3:]
    assert version.count(".") == 2, out
    assert module.startswith(str(venv)), out
    assert library.startswith(str(venv)), out

    path = dict(CLEAN, PATH=str(venv / "bin") + os.pathsep + CLEAN["PATH"],
                OMP_NUM_THREADS="1")
    key = tmp_path / "job.key"
    run(["gradsync-keygen", str(key)], env=path, cwd=str(elsewhere))
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    out = run(["gradsync-launch", "--workers=3", "--servers=0",
               "--metrics_port=0", "--", str(venv / "bin" / "python"),
               str(script)], env=path, cwd=str(elsewhere))
    sums = sorted(line.split("SUM ", 1)[1] for line in out.splitlines()
                  if "SUM " in line)
    assert sums == ["0 6.0", "1 6.0", "2 6.0"], out
