"""torch.distributed over gradsync across simulated hosts (network
namespaces made by tools/simhosts.sh, torn down after): a job whose
MASTER_ADDR is not loopback refuses clearly on every rank without the job's
key file, and runs, encrypted, with it; with two ranks a host (torchrun's
--nproc_per_node=2 on two nodes) the ranks of a host exchange through
shared memory and the hosts over sealed TCP streams."""
import os
import subprocess
import sys

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
# An exact 4 MiB all-reduce through the torch.distributed backend.
LARGE = """
import torch, torch.distributed as dist
import gradsync
dist.init_process_group("gradsync")
r, n = dist.get_rank(), dist.get_world_size()
base = torch.arange(1 << 20, dtype=torch.float32)
t = base + r
dist.all_reduce(t)
print("EXACT %d %s" % (r, torch.equal(t, base * n + n * (n - 1) // 2)), flush=True)
dist.destroy_process_group()
"""


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


def run_ranks(name, script, extra_env, per_host=1):
    """`per_host` ranks on each of the two hosts, rank r on host
    r // per_host; [(exit code, output)] by rank."""
    master = subprocess.check_output([SIMHOSTS, "addr", name, "0"]).decode().strip()
    procs = []
    world = 2 * per_host
    for rank in range(world):
        env = job.base_env(dict(extra_env, RANK=str(rank), WORLD_SIZE=str(world),
                                LOCAL_RANK=str(rank % per_host), MASTER_ADDR=master,
                                MASTER_PORT="29500"))
        procs.append(subprocess.Popen(
            [SIMHOSTS, "run", name, str(rank // per_host), sys.executable,
             str(script)],
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


def test_two_ranks_a_host_share_memory_beside_sealed_streams(hosts, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(LARGE)
    key = tmp_path / "job.key"
    subprocess.check_call([KEYGEN, str(key)])
    ran = run_ranks(hosts, script, {"GRADSYNC_KEY_FILE": str(key)}, per_host=2)
    for rank, (code, out) in enumerate(ran):
        assert code == 0, out
        assert "EXACT %d True" % rank in out, out
        assert ("use shared memory, the others TCP streams (1 peer(s))"
                in out), out
    assert "ring over TCP streams, sealed" in ran[0][1], ran[0][1]


# Embedding rows on a shard of the other host (sealed streams), pulled and
# pushed by both ranks for 5 sync steps of fixed gradients.
EMBEDDING = """
import hashlib, torch
import gradsync, gradsync.torch as gst
gradsync.init(num_servers=1)  # the scheduler at MASTER_PORT + 1, where the shard joins
bag = gst.ShardedEmbeddingBag(None, 8, mode="sum")
ids = torch.tensor([[1, 2, 3, 1 << 40]])
start = bag.pull(ids.reshape(-1))
for step in range(5):
    bag(ids).sum().backward()
bag.eval()
rows = bag.pull(ids.reshape(-1))
print("ROWS %d %s %.6f" % (gradsync.rank(), hashlib.sha256(rows.numpy().tobytes()).hexdigest(),
                           (start - rows).abs().max().item()), flush=True)
gradsync.shutdown()
"""


def test_embedding_rows_on_a_shard_of_another_host(hosts, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(EMBEDDING)
    key = tmp_path / "job.key"
    subprocess.check_call([KEYGEN, str(key)])
    master = subprocess.check_output([SIMHOSTS, "addr", hosts, "0"]).decode().strip()
    shard_host = subprocess.check_output([SIMHOSTS, "addr", hosts, "1"]).decode().strip()
    env = {"GRADSYNC_KEY_FILE": str(key), "GRADSYNC_EMBEDDING_OPTIMIZER": "sgd",
           "GRADSYNC_EMBEDDING_LR": "0.5"}
    # The shard joins the scheduler rank 0 hosts (MASTER_PORT + 1).
    shard = subprocess.Popen(
        [SIMHOSTS, "run", hosts, "1", job.SERVER, "--role=server", "--metrics_port=0",
         "--scheduler=%s:29501" % master, "--host=" + shard_host],
        env=job.base_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        ran = run_ranks(hosts, script, env)
    finally:
        try:
            shard_out, _ = shard.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            shard.kill()
            shard_out, _ = shard.communicate()
    lines = []
    for rank, (code, out) in enumerate(ran):
        assert code == 0, out + "\n--- shard\n" + shard_out.decode("utf-8", "replace")
        lines.append([l for l in out.splitlines() if l.startswith("ROWS %d " % rank)][0])
    digests = [l.split()[2] for l in lines]
    print("\n".join(lines))
    assert digests[0] == digests[1], lines  # both read the same rows
    # 5 steps of lr 0.5 x the gradient (1 in each element, on both ranks).
    assert abs(float(lines[0].split()[3]) - 2.5) < 1e-4, lines
