"""Cores shared between jobs and ranks that run side by side (eagle3.threads)."""

from __future__ import annotations

import os

from eagle3.threads import (
    ONEDNN_PRIMITIVE_CACHE,
    concurrent_jobs,
    configure_job_threads,
    job_threads,
    ranks_share_cores,
)

JOBLIB = {"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "n_jobs": 2}
BASIC = {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}


def test_joblib_jobs_at_once_divide_the_cores():
    assert concurrent_jobs(JOBLIB, multirun=True, cores=8) == 2
    assert job_threads(None, 2, 8) == 4
    assert concurrent_jobs({**JOBLIB, "n_jobs": -1}, multirun=True, cores=8) == 8  # joblib: one per core
    assert concurrent_jobs({**JOBLIB, "n_jobs": 16}, multirun=True, cores=8) == 8
    assert job_threads(None, 8, 8) == 1 and job_threads(None, 3, 2) == 1  # never below one thread


def test_one_job_at_a_time_keeps_every_core_and_an_explicit_count_wins():
    assert concurrent_jobs(BASIC, multirun=True, cores=8) == 1
    assert concurrent_jobs(JOBLIB, multirun=False, cores=8) == 1  # a plain run is one job
    assert job_threads(None, 1, 8) == 8
    assert job_threads(3, 2, 8) == 3


def test_a_job_keeps_an_epochs_cpu_kernels_unless_its_environment_says_otherwise(monkeypatch):
    """oneDNN's kernel cache holds an epoch's matmul shapes (its default 1,024 did not: every epoch
    rebuilt them); a capacity the user's environment sets is left alone."""
    import torch

    threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    try:
        configure_job_threads(threads, None, multirun=False)
        assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(ONEDNN_PRIMITIVE_CACHE) == "16384"
        monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "2048")
        configure_job_threads(threads, None, multirun=False)
        assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "2048"
    finally:
        torch.set_num_threads(threads)


def test_cpu_ranks_share_the_jobs_threads_while_training(monkeypatch):
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    before = torch.get_num_threads()
    with ranks_share_cores(1, on_cpu=True) as one, ranks_share_cores(4, on_cpu=False) as gpu:
        assert one is None and gpu is None  # one rank keeps the job's share; GPU ranks have devices
        assert os.environ["OMP_NUM_THREADS"] == "4"
    with ranks_share_cores(2, on_cpu=True) as threads:
        # 2 threads each, also for ranks spawned now (they read the variable when torch starts).
        assert threads == 2 and torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
    assert torch.get_num_threads() == before and os.environ["OMP_NUM_THREADS"] == "4"


def test_config_refuses_a_non_positive_thread_count(cli):
    done = cli("stage=plan", "cpu_threads=0")
    assert done.returncode == 2 and "cpu_threads" in done.stderr
    ok = cli("stage=plan", "cpu_threads=1")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "threads: 1 intra-op thread per job (cpu_threads)" in ok.stdout + ok.stderr
