"""SGLang and vLLM servers: what each engine is, command lines from the typed config, processes that
always stop, and the clients that talk to them.

`engines` holds the constants (backends, profiles, health paths, sm120 facts), `rules` the config
rules of a server, `commands` builds `(argv, env)` for `server.backend` (checking the draft
first), `process` runs it bound to loopback, waits for health and stops the whole process group
on any exit (`server_endpoints(cfg, run_dir)` is the one call stages need: launch, or connect to
`server.urls`), `http` is the one HTTP layer, `engine_client` / `engine_metrics` / `benchmark` the
serving benchmark. Import from the submodules; this package imports none of them (no torch).
"""
