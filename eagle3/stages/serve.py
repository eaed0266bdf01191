"""Stage `serve`: launch the configured SGLang/vLLM server (with its draft) and hold it.

Standalone (not part of `stage=all`). It prints the exact command line -- environment first, so
stdout is a script a user can paste -- starts the server bound to 127.0.0.1, prints its URL once
the health endpoint answers, and holds it until Ctrl-C, then stops it and every process it
spawned. The server's log goes to the run directory (and to the console).

The draft: `server.speculative.draft_path`, or, when that is null, the export for this engine
of this config's complete train output (`<train unit>/draft/<engine>`: the chain whose data
`generate.backend` generated, e.g. the in-process demo chain served with `server=vllm`). Either is
validated before launch (`eagle3.serving.commands`); `server.speculative.algorithm=null` serves the
target alone. `serve.dry_run=true` prints the command and environment and launches nothing.
With `server.urls` set nothing is launched: the URLs are health-checked and printed.
`serve.hidden_states=true` serves `extract.server` instead, the way `extract.backend=vllm|sglang` launches
it (vLLM's extract_hidden_states method and eagle3's connector; SGLang with eagle3's capture plugin), for
extraction or online training jobs elsewhere to use through `extract.server.urls` (vLLM: with a shared
`extract.http.exchange_dir`).

    python scripts/run.py stage=serve model=kimi_k25 server=sglang_sm120 \\
        server.speculative.draft_path=/models/kimi-eagle3/draft/sglang serve.dry_run=true
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional

from eagle3.config.schema import Eagle3Config
from eagle3.engines import VLLM
from eagle3.stages.base import MissingInput, StageContext, StandaloneStage, require

log = logging.getLogger("eagle3")


def resolve_draft(config: Eagle3Config, ctx: StageContext) -> Optional[Path]:
    """The draft directory to serve: configured, this config's trained export, or None (no speculation).

    Raises:
        MissingInput: `draft_path` is null and this config has no complete train output.
    """
    spec = config.server.speculative
    if spec.algorithm is None:
        return None
    if spec.draft_path is not None:
        return Path(spec.draft_path).expanduser()
    from eagle3.stages.train import EXPORT_DIR, TRAIN

    unit = config.dataset.name
    try:
        manifest = require(TRAIN, config, ctx, unit)
    except MissingInput as exc:
        raise MissingInput(f"server.speculative.draft_path is null, which means the draft this config "
                           f"trains, but {exc}; or set server.speculative.draft_path to an export, or "
                           "server.speculative.algorithm=null to serve the target alone") from None
    return manifest.directory / EXPORT_DIR / config.server.backend


def serve(config: Eagle3Config, ctx: StageContext, out=None) -> list:
    """Launch and hold the server (see the module docstring); returns no manifests.

    Args:
        out: Where the command line and URL are printed (default stdout).
    """
    from eagle3.serving.commands import build_command
    from eagle3.serving.health import check_health
    from eagle3.serving.machine import refuse_unservable
    from eagle3.serving.process import ServerProcess, records_dir

    out = out or sys.stdout
    states = config.serve.hidden_states
    server = config.extract.server if states else config.server
    key = "extract.server" if states else "server"
    if server.urls:
        urls = check_health(list(server.urls), str(server.backend))
        for url in urls:
            print(f"# eagle3 serve: {server.backend} already running and healthy at {url} ({key}.urls; "
                  "nothing launched)", file=out, flush=True)
        return []

    if states:
        from eagle3.extract.sources import exchange_dir, extraction_command

        command = extraction_command(config, ctx.run_dir)
        where = (f"into {exchange_dir(config.extract)}" if command.backend == VLLM
                 else "through /generate (eagle3's capture plugin)")
        what = f"{command.backend} at {command.url}, handing out hidden states {where}"
    else:
        command = build_command(config, resolve_draft(config, ctx))
        what = f"{command.backend} at {command.url}" + (f" with draft {command.draft}" if command.draft else "")
    if config.serve.dry_run:
        print(f"# eagle3 serve: {what} (dry run: nothing launched)", file=out)
        print(command.shell(), file=out, flush=True)
        return []

    if states and command.backend == VLLM:
        exchange_dir(config.extract).mkdir(parents=True, exist_ok=True)
    refuse_unservable(command.backend, command.draft is not None)
    log_path = ctx.run_dir / command.log_name
    print(f"# eagle3 serve: starting {what}; log {log_path}", file=out)
    print(command.shell(), file=out, flush=True)
    try:
        with ServerProcess(command, log_path, startup_timeout_s=server.startup_timeout_s,
                           echo=sys.stderr, records_dir=records_dir(config.paths)) as proc:
            print(f"# eagle3 serve: ready at {proc.url} (OpenAI API {proc.url}/v1); Ctrl-C stops it",
                  file=out, flush=True)
            log.info("serve: %s ready at %s (pid %s)", command.backend, proc.url, proc.pid)
            proc.wait()  # returns only by raising: Ctrl-C, or the server exiting on its own
    except KeyboardInterrupt:
        print(f"# eagle3 serve: stopped {command.backend} at {command.url} (Ctrl-C)", file=out, flush=True)
    return []


SERVE = StandaloneStage(
    name="serve",
    help="launch the configured SGLang/vLLM server (and draft) on 127.0.0.1 and hold it until Ctrl-C",
    run=serve,
)
