"""PyTorch's own distributed tests over the "gradsync" backend: every test
in conformance_pass.txt (collective, group and DDP tests that gloo and
gradsync both pass, world size 3, a part of the whole list that fits the
suite's time) must pass. The whole comparison with gloo is
tests/torch/conformance_run.py --compare (docs/pytorch.md)."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_the_listed_tests_of_torch_pass_over_gradsync(tmp_path):
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "conformance_run.py"),
         "--backend=gradsync", "--world_size=3", "--timeout_s=900",
         "--only=" + os.path.join(HERE, "conformance_pass.txt"),
         "--out=" + str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1000)
    out = done.stdout.decode("utf-8", "replace")
    assert done.returncode == 0, out[-20000:]
    assert " listed tests passed for gradsync" in out, out[-4000:]
