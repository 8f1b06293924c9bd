"""tinyformer.translation.distributed: the group of one, launch detection, the mpiexec command, the NCCL
path's pieces that need no GPU, and the communicators and buckets between two real MPI ranks
(tests/mpi_checks.py, one launch)."""

import json
import sys

import children
import devices
import mpi_helpers
import numpy as np
import pytest

from tinyformer.translation import distributed
from tinyformer.model import nn
from tinyformer.translation.distributed import launch


def test_the_group_of_one_is_the_identity():
    comm = distributed.SingleProcess()
    values = np.arange(4.0)
    assert comm.all_reduce(values) is values and comm.all_reduce_async(values, "max").wait() is values
    assert comm.broadcast(values) is values and comm.broadcast_object({"a": 1}) == {"a": 1}
    assert comm.all_gather_object(3) == [3] and comm.report_failure("x") is True
    comm.barrier()
    with pytest.raises(ValueError, match="op must be one of"):
        comm.all_reduce(values, "mean")
    with pytest.raises(ValueError, match=r"root must be a rank in \[0, 1\), got 1"):
        comm.broadcast(values, root=1)


def test_outside_an_mpi_launch_init_gives_the_group_of_one(monkeypatch):
    for name in launch.MPI_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(distributed, "_current", None)
    assert isinstance(distributed.init(), distributed.SingleProcess)
    assert distributed.world_size() == 1 and distributed.rank() == 0
    with pytest.raises(ValueError, match="--comm nccl reduces GPU arrays: it needs --device cuda"):
        distributed.init("nccl", device="cpu")
    with pytest.raises(ValueError, match="comm must be one of"):
        distributed.init("gloo")


def test_an_mpi_launch_is_told_by_the_environment():
    assert not launch.launched_by_mpi({"PATH": "/bin"})
    for name in launch.MPI_ENVIRONMENT:
        assert launch.launched_by_mpi({name: "2"})
    assert launch.environment_rank({"OMPI_COMM_WORLD_RANK": "1"}) == 1
    assert launch.environment_rank({"PMI_RANK": "0"}) == 0 and launch.environment_rank({}) is None


def test_the_mpiexec_command_and_a_missing_mpiexec(monkeypatch, tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'mpiexec (Open MPI) 5.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TINYFORMER_MPIEXEC", str(fake))
    for name in launch.ROOT_CONSENT:
        monkeypatch.setenv(name, "1")
    assert launch.find_mpiexec() == str(fake)
    assert launch.mpiexec_command(3, ["python", "x.py"]) == [
        str(fake), "-n", "3", "--enable-recovery", "--oversubscribe", "--bind-to", "none", "python", "x.py"]
    fake.write_text("#!/bin/sh\necho 'HYDRA build details'\n")
    assert launch.mpiexec_command(2, ["a"]) == [str(fake), "-n", "2", "a"]  # no Open MPI options for others
    monkeypatch.setattr(launch, "find_mpiexec", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"--nproc needs mpiexec: install the mpi extra"):
        launch.mpiexec_command(2, ["a"])


def test_as_root_open_mpi_needs_its_consent_and_is_told_so_in_one_line(monkeypatch, tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'mpiexec (Open MPI) 5.0'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(launch.os, "geteuid", lambda: 0)
    for name in launch.ROOT_CONSENT:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(PermissionError, match="OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"):
        launch.mpiexec_command(2, ["a"], mpiexec=str(fake))
    monkeypatch.setattr(launch.os, "geteuid", lambda: 1000)  # not root: nothing to allow
    assert launch.mpiexec_command(2, ["a"], mpiexec=str(fake))[:3] == [str(fake), "-n", "2"]


def test_rank_seeds_are_apart_from_each_other_and_from_the_initialisations_stream():
    seeds = {distributed.rank_seed(7, r) for r in range(0, 5)}
    assert len(seeds) == 5 and 7 not in seeds  # 7 itself is the initialisation's default_rng(7)
    # the same in every process (each rank computes its own): the documented SeedSequence((seed, rank)) draw
    assert distributed.rank_seed(7, 1) == int(np.random.SeedSequence([7, 1]).generate_state(1, dtype=np.uint64)[0])
    assert distributed.rank_seed(8, 1) != distributed.rank_seed(7, 1)


def test_the_code_fingerprint_names_the_version_and_the_sources():
    fingerprint = distributed.code_fingerprint()
    assert fingerprint.startswith("0.1.0 (") and len(fingerprint) == len("0.1.0 (") + 13
    assert fingerprint == distributed.code_fingerprint()


def test_buckets_in_a_group_of_one_leave_the_gradients_as_they_are():
    model = nn.Transformer.from_preset("tiny", vocab_size=30, dropout=0.0, seed=1)
    src, tgt = np.array([[5, 6, 7, 2]]), np.array([[1, 8, 9]])
    model(src, tgt).sum().backward()
    expected = [p.grad.copy() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    buckets = distributed.GradientBuckets(distributed.SingleProcess(), model.parameters(), bucket_mb=0.1)
    assert len(buckets.buckets) > 1 and sum(b.size for b in buckets.buckets) == model.num_parameters()
    buckets.arm()
    model(src, tgt).sum().backward()
    assert all(b.work is not None for b in buckets.buckets)  # every bucket started inside backward()
    buckets.finish()
    for p, e in zip(model.parameters(), expected):
        np.testing.assert_array_equal(p.grad, e)
    for p in model.parameters():
        p.grad = None
    buckets.finish()  # a step without a backward pass (a rank without batches): zeros
    assert all(not p.grad.any() for p in model.parameters())
    buckets.close()


def test_nccl_unique_ids_travel_as_json():
    from tinyformer.translation.distributed import nccl

    for unique_id in (bytes(range(128)), tuple(range(-64, 64))):
        encoded = json.loads(json.dumps(nccl._encode_id(unique_id)))
        assert nccl._decode_id(encoded) == unique_id


@devices.needs_gpu
def test_a_one_rank_nccl_communicator_reduces_and_broadcasts_gpu_arrays():
    import cupy

    from tinyformer.translation.distributed import nccl

    if not nccl.nccl_available():
        pytest.skip("CuPy's NCCL binding does not load (install nvidia-nccl-cu12: the gpu extra)")
    comm = nccl.NCCLCommunicator(timeout=60)
    values = cupy.arange(8, dtype=cupy.float32)
    work = comm.all_reduce_async(values)
    cupy.testing.assert_array_equal(work.wait(), cupy.arange(8, dtype=cupy.float32))
    cupy.testing.assert_array_equal(comm.broadcast(values), cupy.arange(8, dtype=cupy.float32))
    np.testing.assert_array_equal(comm.all_reduce(np.ones(3)), np.ones(3))  # host arrays take MPI's way
    comm.close()


def test_a_one_process_run_imports_neither_mpi4py_nor_nccl(tmp_path):
    # the first 200 pairs of each split: what it imports is the point, not the data
    script = ("import sys\n"
              "from tinyformer.translation.train import TrainConfig, Trainer, builders\n"
              "whole = builders.load_corpus\n"
              "builders.load_corpus = lambda config, split: tuple(side[:200] for side in whole(config, split))\n"
              f"Trainer(TrainConfig(max_steps=2, max_tokens=256, vocab_size=120, warmup_steps=2, eval_every=100, "
              f"bleu_samples=4, save_dir={str(tmp_path)!r}), echo=lambda *a: None, progress=False).run()\n"
              "print(sorted(m for m in sys.modules if m.startswith(('mpi4py', 'cupy.cuda.nccl', "
              "'tinyformer.translation.distributed.mpi', 'tinyformer.translation.distributed.nccl'))))\n")
    result = children.run([children.PYTHON, "-c", script], timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


@mpi_helpers.requires_mpi
def test_two_ranks_reduce_share_and_notice_failures():
    result = mpi_helpers.run(mpi_helpers.mpiexec(2, [children.PYTHON, children.ROOT / "tests" / "mpi_checks.py"]))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checks = {k: v for line in result.stdout.splitlines() if line.startswith("{") for k, v in json.loads(line).items()}
    assert checks["all_reduce sum"] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
    assert checks["all_reduce max"] == [1, 0]
    assert checks["broadcast from 1"] == [1.0, 1.0, 1.0]
    assert checks["broadcast_object"] == {"from": 0, "text": "αβ"}
    assert checks["all_gather_object"] == [[0], [1]]
    buckets = checks["buckets"]
    assert buckets["count"] > 5 and buckets["started during backward"] == buckets["count"]
    assert buckets["sums equal"] and buckets["hidden share in [0, 1]"]
    assert checks["agreement"] == ("the ranks were not started alike: rank 1 has --seed 1 (rank 0: 0); start every "
                                   "rank with the same command, tinyformer code and files")
    assert checks["drift"].startswith("step 7: the ranks' parameters drifted apart from rank 0's (rank 1: 1 parameter")
    assert checks["peer failed"] == {"message": "rank 1 stopped: disk full", "quiet": True}
    assert checks["timeout"]["message"].startswith("rank 0: all_reduce did not complete within 1 s (--comm-timeout)")
    assert 0.9 <= checks["timeout"]["seconds"] < 5
    lost = checks["heartbeat"]
    assert lost["ranks"] == [1] and not lost["quiet"] and lost["seconds"] < 10
    assert "rank 1 (pid" in lost["message"] and "sent no heartbeat for 2 s" in lost["message"]


def test_the_command_line_refuses_nccl_on_the_cpu(tmp_path, capsys, monkeypatch):
    from tinyformer import cli

    monkeypatch.setattr(distributed, "_current", None)
    code = cli.main(["train", "--comm", "nccl", "--save-dir", str(tmp_path), "--no-progress"])
    assert code == 2
    assert capsys.readouterr().err == "tinyformer train: error: --comm nccl reduces GPU arrays: it needs --device cuda\n"
    assert not any(tmp_path.iterdir())
