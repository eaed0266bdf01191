"""Raw datasets to canonical conversations: schema adapters, checks and loading.

Stage `prep` (eagle3/stages/prep.py) drives these modules; later stages reuse
:mod:`eagle3.data.conversation` to check what they read. Importing this package is cheap (no
`datasets`, no torch), because the config validator imports the adapter registry.
"""

from eagle3.data.conversation import (
    ROLES,
    ConversationError,
    check_conversation,
    conversation_problem,
    prompt_key,
)

__all__ = ["ROLES", "ConversationError", "check_conversation", "conversation_problem", "prompt_key"]
