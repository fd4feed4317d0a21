"""PyTorch's own distributed tests (DistributedTest._DistTestBase, shipped in
the torch wheel as torch/testing/_internal/distributed/distributed_test.py)
over a torch.distributed backend, unchanged: each test spawns WORLD_SIZE
processes that join through a file store, as torch's own CI runs them.

    BACKEND=gradsync WORLD_SIZE=2 .venv/bin/python -m pytest tests/torch/conformance.py
    BACKEND=gloo ...                                      # the same for gloo

BACKEND (gradsync), WORLD_SIZE (2) and TEMP_DIR (a new folder) are read by
torch's module when it is imported; DISTRIBUTED_TESTS_DEFAULT_TIMEOUT (60)
bounds each test, so that a hang is a failure.
tests/torch/conformance_run.py runs chosen tests for a backend, or every
test for gradsync and gloo side by side.
"""
import os
import tempfile

os.environ.setdefault("BACKEND", "gradsync")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "60")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="conformance.")

import gradsync  # noqa: E402,F401  registers the backend (in every rank)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# torch's tests run DDP and subgroup cases only for the backends named in
# these sets (read when the module below is imported): gradsync does both.
if os.environ["BACKEND"] == "gradsync":
    for feature in ("ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("gradsync")
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
