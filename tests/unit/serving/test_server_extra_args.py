"""Flags in `server.extra_args` meet the rules of the typed keys they stand for (sm120 kernels, memory).

Before, `server.extra_args=[--attention-backend,fa3]` on sm120 passed validation and reached the
server after the launcher's own `--attention-backend triton` (the last one wins): the kernel that
fails with "Unsupported architecture". Both spellings, `--flag value` and `--flag=value`, count.
"""

from __future__ import annotations

import pytest

from eagle3.cli import check_config
from eagle3.config.convert import to_settings
from eagle3.serving.commands import ServerConfigError, build_command
from eagle3.serving.rules import RULED_FLAGS, extra_arg_flags
from tests.conftest import compose_config

KERNEL_LINE = "-- does not run on sm120 (Unsupported architecture); valid: triton, flashinfer (MHA)"


def errors_for(overrides: list[str]) -> list[str]:
    return check_config(compose_config(overrides))


@pytest.mark.parametrize("args,shown", [
    ("[--attention-backend,fa3]", "--attention-backend fa3"),
    ("['--attention-backend=fa3']", "--attention-backend=fa3"),
    ("[--prefill-attention-backend,trtllm_mha]", "--prefill-attention-backend trtllm_mha"),
    ("['--decode-attention-backend=flashmla']", "--decode-attention-backend=flashmla"),
    ("[--moe-runner-backend,deep_gemm]", "--moe-runner-backend deep_gemm"),
    ("[--log-level,info,'--attention-backend=trtllm_mla']", "--attention-backend=trtllm_mla"),
])
def test_sm120_kernel_flags_in_extra_args_are_refused(args, shown):
    assert errors_for(["server=sglang_sm120", f"server.extra_args={args}"]) == [
        f"server.extra_args: '{shown}' {KERNEL_LINE}"]


@pytest.mark.parametrize("overrides,shown", [
    (["server=sglang_sm120", "server.extra_args=[--mem-fraction-static,0.95]"], "--mem-fraction-static 0.95"),
    (["server=sglang_sm120", "server.extra_args=['--mem-fraction-static=0.95']"], "--mem-fraction-static=0.95"),
    (["server=vllm", "server.profile=sm120", "server.extra_args=[--gpu-memory-utilization,0.9]"],
     "--gpu-memory-utilization 0.9"),
])
def test_sm120_memory_fraction_in_extra_args_is_refused(overrides, shown):
    assert errors_for(overrides) == [f"server.extra_args: '{shown}' -- too high for sm120 (OOM at startup); "
                                     "valid: <= 0.85"]


def test_memory_fraction_in_extra_args_must_be_a_fraction_anywhere():
    assert errors_for(["server=sglang", "server.extra_args=['--mem-fraction-static=1.5']"]) == [
        "server.extra_args: '--mem-fraction-static=1.5' -- a fraction of the accelerator memory; valid: (0, 1] or null"]
    assert errors_for(["server=sglang", "server.extra_args=[--mem-fraction-static,lots]"]) == [
        "server.extra_args: '--mem-fraction-static lots' -- not a number; valid: a fraction in (0, 1]"]


def test_the_extraction_server_is_checked_the_same_way():
    errors = errors_for(["extract.backend=vllm", "extract.server.profile=sm120",
                         "extract.server.extra_args=['--gpu-memory-utilization=0.99']"])
    assert "extract.server.extra_args: '--gpu-memory-utilization=0.99' -- too high for sm120 (OOM at startup); " \
           "valid: <= 0.85" in errors


def test_the_generation_server_is_checked_the_same_way_when_generate_uses_it():
    flags = ["server@generate.server=sglang_sm120", "generate.server.extra_args=[--attention-backend,fa3]"]
    assert errors_for(flags) == []  # generate.backend=hf: no server generates
    assert errors_for(["generate.backend=sglang", *flags]) == [
        f"generate.server.extra_args: '--attention-backend fa3' {KERNEL_LINE}"]


def test_what_runs_on_sm120_passes_and_replaces_the_launchers_defaults():
    overrides = ["server=sglang_sm120", "server.kernels.attention_backend=null", "server.speculative.algorithm=null",
                 "server.extra_args=[--attention-backend,flashinfer,'--mem-fraction-static=0.8']"]
    assert errors_for(overrides) == []
    argv = build_command(to_settings(compose_config(overrides))).argv
    assert argv.count("--attention-backend") == 1 and argv[argv.index("--attention-backend") + 1] == "flashinfer"
    assert "--mem-fraction-static" not in argv and argv[-1] == "--mem-fraction-static=0.8"  # not 0.85, then 0.8
    # The same kernel is fine off sm120.
    assert errors_for(["server=sglang_h200", "server.extra_args=[--attention-backend,fa3]"]) == []


def test_the_launcher_refuses_a_bypass_the_entrypoint_never_saw():
    cfg = compose_config(["server=sglang_sm120", "server.speculative.algorithm=null",
                          "server.extra_args=[--attention-backend,fa3]"])
    with pytest.raises(ServerConfigError, match=r"server\.extra_args: '--attention-backend fa3' -- does not run"):
        build_command(to_settings(cfg))


def test_extra_arg_flags_reads_both_spellings_and_keeps_the_last():
    assert extra_arg_flags(["--a", "1", "--b=2", "--flag", "--c", "x", "--a=3"]) == {
        "--a": ("--a=3", "3"), "--b": ("--b=2", "2"), "--flag": ("--flag", None), "--c": ("--c x", "x")}
    # The launcher writes these flags from the same table the rules read them back with.
    argv = build_command(to_settings(compose_config(["server=sglang_sm120", "server.speculative.algorithm=null",
                                                     "server.mem_fraction_static=0.8"]))).argv
    for typed, flag in RULED_FLAGS["sglang"].items():
        if typed in ("kernels.attention_backend", "mem_fraction_static"):
            assert flag in argv, (flag, argv)
