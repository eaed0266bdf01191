"""The choices of draft training a config makes (`train.*`), torch-free for config validation."""

from __future__ import annotations

#: `train.out_of_vocab`: positions whose target argmax is outside the draft vocab are left out
#: of the loss (mask) or trained toward the renormalised in-vocab distribution (keep); they
#: always count as misses in the metrics.
OOV_MASK, OOV_KEEP = "mask", "keep"
OUT_OF_VOCAB_POLICIES = (OOV_MASK, OOV_KEEP)
#: `train.hidden_states`: read from the store stage extract filled, or computed per batch while training.
STORE, ONLINE = "store", "online"
HIDDEN_STATE_MODES = (STORE, ONLINE)
#: `train.strategy` (Lightning strategies this trainer is tested with).
STRATEGIES = ("auto", "ddp", "ddp_spawn", "fsdp")
#: `train.precision`: auto = bf16-mixed on a GPU, 32-true on CPU; else a Lightning precision.
AUTO_PRECISION = "auto"
PRECISIONS = (AUTO_PRECISION, "32-true", "bf16-mixed", "16-mixed", "bf16-true")
