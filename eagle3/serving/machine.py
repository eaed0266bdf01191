"""What this machine has that a launch needs, checked before a server is started.

Config validation cannot know the machine (a config composed on a laptop runs on a GPU node);
these checks run where the server would start, so a command that cannot work here fails in one
line instead of after a minute of loading.
"""

from __future__ import annotations

import glob

from eagle3.engines import SGLANG, SGLANG_NO_CPU_EAGLE
from eagle3.serving.launch_checks import ServerConfigError

__all__ = ["ACCELERATOR_DEVICES", "accelerator_visible", "refuse_unservable"]

#: Device nodes of the GPUs SGLang's speculative decoding runs on (NVIDIA's; AMD's ROCm).
ACCELERATOR_DEVICES = ("/dev/nvidia[0-9]*", "/dev/kfd")


def accelerator_visible() -> bool:
    """Whether this machine shows a GPU device node (`ACCELERATOR_DEVICES`; this process's torch may be a CPU
    build on a GPU machine, so it is not asked)."""
    return any(glob.glob(pattern) for pattern in ACCELERATOR_DEVICES)


def refuse_unservable(backend: str, speculative: bool) -> None:
    """Raise ServerConfigError (one line) for a launch this machine cannot serve: an SGLang draft without a GPU."""
    if backend == SGLANG and speculative and not accelerator_visible():
        raise ServerConfigError([f"server.backend: {SGLANG!r} -- no GPU on this machine, and {SGLANG_NO_CPU_EAGLE}; "
                                 "valid: server=vllm on a CPU (the chain's in-process eval measures the draft "
                                 "anywhere), or this command on a GPU machine"])
