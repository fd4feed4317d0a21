"""torch.distributed over gradsync across simulated hosts (network
namespaces made by tools/simhosts.sh, torn down after): a job whose
MASTER_ADDR is not loopback refuses clearly on every rank without the job's
key file, and runs, encrypted, with it."""
import os
import subprocess

import pytest

import job

SIMHOSTS = os.path.join(job.ROOT, "tools", "simhosts.sh")
KEYGEN = job._binary("wire/gradsync_keygen")
SCRIPTS = {
    # The torch.distributed backend.
    "backend": """
import torch, torch.distributed as dist
import gradsync
dist.init_process_group("gradsync")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("SUM %d %s" % (dist.get_rank(), t.item()), flush=True)
dist.destroy_process_group()
""",
    # gradsync.init() under torchrun's variables (rank 0 hosts the
    # scheduler at MASTER_PORT + 1).
    "init": """
import torch
import gradsync, gradsync.torch
gradsync.init()
t = torch.tensor([float(gradsync.rank() + 1)])
gradsync.torch.allreduce(t, average=False)
print("SUM %d %s" % (gradsync.rank(), t.item()), flush=True)
gradsync.shutdown()
""",
}


@pytest.fixture
def hosts():
    if os.geteuid() != 0 or subprocess.run([SIMHOSTS, "check"]).returncode:
        pytest.skip("network namespaces cannot be made here (not root)")
    name = "gst%d" % os.getpid()
    subprocess.check_call([SIMHOSTS, "up", name, "2"])
    try:
        yield name
    finally:
        subprocess.call([SIMHOSTS, "down", name])


def run_ranks(name, script, extra_env):
    """Rank r on host r; [(exit code, output)] by rank."""
    master = subprocess.check_output([SIMHOSTS, "addr", name, "0"]).decode().strip()
    procs = []
    for rank in range(2):
        env = job.base_env(dict(extra_env, RANK=str(rank), WORLD_SIZE="2",
                                LOCAL_RANK="0", MASTER_ADDR=master,
                                MASTER_PORT="29500"))
        procs.append(subprocess.Popen(
            [SIMHOSTS, "run", name, str(rank), "/usr/bin/python3", str(script)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        results.append((p.returncode, out.decode("utf-8", "replace")))
    return results


@pytest.mark.parametrize("way", sorted(SCRIPTS))
def test_across_hosts_the_key_is_required_then_used(hosts, tmp_path, way):
    script = tmp_path / "job.py"
    script.write_text(SCRIPTS[way])
    refused = run_ranks(hosts, script, {})
    for code, out in refused:
        assert code != 0, out
        assert "is not loopback" in out and "key_file" in out, out
    key = tmp_path / "job.key"
    subprocess.check_call([KEYGEN, str(key)])
    ran = run_ranks(hosts, script, {"GRADSYNC_KEY_FILE": str(key)})
    for rank, (code, out) in enumerate(ran):
        assert code == 0, out
        assert "SUM %d 3.0" % rank in out, out
