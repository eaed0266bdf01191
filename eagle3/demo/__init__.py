"""The demo target and demo datasets: a CPU-sized stand-in for Kimi-K2.5.

A real target is far too large for CI or a laptop, so the whole pipeline is exercised against a
small Llama that was genuinely trained (``scripts/train_demo_target.py``) to speak Kimi-K2.5's
chat format: same control tokens, same published chat template, reasoning blocks and
``read_file`` tool calls. Its training data and the demo datasets come from documented functions
of the Python standard library, frozen in ``eagle3/assets/demo_corpus.jsonl.gz``.

Modules: ``corpus`` (load + module split), ``conversations`` (plans and the target's voice),
``tokenizer``, ``target_training``, ``evaluation``, ``datasets`` (the two demo tracks),
``fixtures`` (committed test fixtures). The Kimi chat format itself (tokens, assistant-turn
codec) is the real target's and lives in ``eagle3.chat_formats.kimi``.
"""
