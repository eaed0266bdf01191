"""Target generation behind one interface (docs/design.md, 'Backends and servers'): in-process
`hf`, or `vllm` / `sglang` servers through an async OpenAI-compatible client (`http_backend`).

`types` is the interface (requests, results, finish reasons, errors), `factory` maps
`generate.backend` to a backend class (`make_backend`), `regenerate` is the turn-by-turn loop,
`pipeline` the resumable file-to-file run the `generate` stage calls, `reuse` the copying of
batches earlier outputs ran. Importing this package is cheap (no torch, no aiohttp): a backend's
heavy imports happen when `make_backend` builds it.
"""
