"""A conversation in the conventions of the chat format its target speaks.

Datasets arrive in OpenAI form from many producers; a target's template renders some fields verbatim
that the target itself writes in a fixed form (Kimi's tool-call ids). Tokenize applies these
conventions before rendering, so the training text is the text the target would have produced.
The format is told from the template that renders the training text (the training template, else
the tokenizer's own), so a Kimi-derived checkpoint under any name gets it, and any other target is
left as it is.
"""

from __future__ import annotations

from typing import Any

from eagle3.chat_formats.kimi import renders_kimi_tool_calls, with_kimi_call_ids

__all__ = ["for_target"]


def for_target(template: Any, conv: dict) -> dict:
    """`conv` in the conventions of the chat format `template` renders (a copy where anything changes).

    Args:
        template: The chat template text that renders the training text.
        conv: A canonical conversation.
    """
    if renders_kimi_tool_calls(template):
        return with_kimi_call_ids(conv)
    return conv
