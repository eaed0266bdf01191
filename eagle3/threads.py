"""How many cores a job's torch ops may use, when jobs or ranks run side by side on one machine.

torch's intra-op pool takes every core by default. Two jobs that each do so on the same cores
spend their time spin-waiting for each other: two demo trainings at once on 2 cores ran about
5x slower each, not 2x (BENCHMARKS.md). So a job gets `cpu_threads`, or else the machine's
cores divided by the jobs the Hydra launcher runs at once (the joblib launcher's `n_jobs`; the
basic launcher runs one at a time), and a CPU training rank gets its job's share divided by the
ranks on the machine. The choice is logged. `OMP_NUM_THREADS` carries it to processes the job
starts (spawned DDP ranks, tokenize workers); a server the job launches has its own environment
(`server.env`), and alternates with the trainer rather than running beside it (online states
are fetched while the trainer waits).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any, Optional

log = logging.getLogger("eagle3")
JOBLIB_LAUNCHER = "joblib"
#: oneDNN's cache of built kernels (one per matmul shape, bf16 on a CPU). Its default, 1,024, is fewer
#: than the shapes of one epoch of length-sorted draft batches (each batch's forward and backward
#: products), so every epoch rebuilt them all in turn; 16,384 keeps them: the demo's 10-epoch
#: training ~1.1x faster in 15 % less memory (BENCHMARKS.md, "oneDNN's kernel cache over the epochs").
#: An environment that sets ONEDNN_PRIMITIVE_CACHE_CAPACITY keeps its own.
ONEDNN_PRIMITIVE_CACHE = 16384


def onednn_cache_capacity() -> str:
    """The oneDNN kernel-cache capacity a job (and a process it starts) runs with: the environment's, else ours."""
    return os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_PRIMITIVE_CACHE))


def machine_cores() -> int:
    """Cores this process may run on (the affinity mask, e.g. a container's cpuset), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def job_cores() -> int:
    """The cores this job may use: its thread count once `configure_job_threads` ran, else all."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else machine_cores()


def concurrent_jobs(launcher: Optional[Mapping[str, Any]], multirun: bool, cores: int) -> int:
    """Jobs the Hydra launcher runs at once: joblib's `n_jobs` (<= 0: one per core, as joblib reads
    -1), else 1 (the basic launcher runs jobs one after another; a cluster launcher, one per node)."""
    if not multirun or not launcher or JOBLIB_LAUNCHER not in str(launcher.get("_target_", "")).lower():
        return 1
    n_jobs = launcher.get("n_jobs")
    n_jobs = -1 if n_jobs is None else int(n_jobs)
    return cores if n_jobs <= 0 else min(n_jobs, cores)


def job_threads(requested: Optional[int], jobs: int, cores: int) -> int:
    """`cpu_threads` when set, else an equal share of the cores among `jobs`."""
    if requested is not None:
        return max(1, int(requested))
    return max(1, cores // max(1, jobs))


def configure_job_threads(requested: Optional[int], launcher: Optional[Mapping[str, Any]], multirun: bool) -> int:
    """Set this job's torch threads (and OMP_NUM_THREADS for what it starts); returns the count.

    Also oneDNN's kernel cache (`ONEDNN_PRIMITIVE_CACHE`): read when the first kernel is built, which is
    after this (no stage runs a product before its threads are set).
    """
    import torch

    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = onednn_cache_capacity()
    cores = machine_cores()
    jobs = concurrent_jobs(launcher, multirun, cores)
    threads = job_threads(requested, jobs, cores)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    why = "cpu_threads" if requested is not None else f"{cores} cores / {jobs} job{'s' if jobs > 1 else ''} at once"
    log.info("threads: %d intra-op thread%s per job (%s)", threads, "s" if threads > 1 else "", why)
    return threads


@contextlib.contextmanager
def ranks_share_cores(local_ranks: int, on_cpu: bool) -> Iterator[Optional[int]]:
    """While training: each of the ranks on this machine gets its share of the job's threads (CPU).

    Entered in the launching process before the ranks start: spawned ranks read OMP_NUM_THREADS
    when torch starts, and a rank running in this process keeps the count set here; the job's own
    count is back afterwards. Yields the per-rank count, or None when nothing changed.
    """
    if not on_cpu or local_ranks <= 1:
        yield None
        return
    import torch

    budget, before, env_before = job_cores(), torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    threads = max(1, budget // local_ranks)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    log.info("threads: %d per training rank (%d for the job / %d ranks on this machine)", threads, budget, local_ranks)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before


__all__ = ["concurrent_jobs", "configure_job_threads", "job_cores", "job_threads", "machine_cores", "ranks_share_cores"]
