"""The valid values of the schema's choice fields: each list once, as a `Literal`, with its tuple.

The schema names them in its fields (`setting("kl", Loss)`), `eagle3.config.fields.check_fields`
refuses a value outside them, and the package that acts on a choice imports its tuple from here
(its implementations keyed by these names: `tests/unit/config/test_choices.py` checks that every
name has one and no implementation lacks its name). What each value does is documented where it is
acted on (the module named beside each list). Engine names, dtypes and server profiles are leaf
facts the config's resolvers read too: `eagle3.engines`, `eagle3.dtypes`.
"""

from __future__ import annotations

import typing
from typing import Literal

#: `dataset.sources.<name>.track` (eagle3.data.conversation; docs/design.md, 'Two tracks').
Track = Literal["target_native", "prompt_only"]
#: `dataset.sources.<name>.schema`: the adapters of eagle3.data.adapters.
DatasetSchema = Literal["openai_messages", "sharegpt", "opencodeinstruct", "problem_solution",
                        "glaive_function_calling", "deepswe_trajectories"]
#: `dataset.sources.<name>.generator`: the demo's built-in sets (eagle3.demo.datasets).
Generator = Literal["demo_native", "demo_prompts"]
#: `generate.length_policy` (eagle3.generation.regenerate).
LengthPolicy = Literal["keep_flagged", "drop"]
#: `generate.http.endpoint_strategy` (eagle3.generation.http_settings).
EndpointStrategy = Literal["least_busy", "round_robin"]
#: `tokenize.overlength` and `tokenize.answer_ids` (eagle3.data.render).
Overlength = Literal["truncate", "drop"]
AnswerIds = Literal["emitted", "reencoded"]
#: `extract.backend` (eagle3.extract.sources) and `extract.storage_format` (eagle3.states.formats).
ExtractBackend = Literal["hf", "vllm", "sglang"]
StorageFormat = Literal["bf16", "compact", "fp8", "fp32"]
#: `train.*` and `model.draft.attention` (eagle3.draft.options says what each does).
HiddenStates = Literal["store", "online", "hybrid"]
OutOfVocab = Literal["mask", "keep"]
Teacher = Literal["draft_vocab", "full_vocab"]
Loss = Literal["kl", "tv", "jsd", "nla", "lk"]
StepWeights = Literal["decay", "dpace"]
TttChains = Literal["all", "on_policy", "rescored"]
LrSchedule = Literal["cosine", "linear"]
Strategy = Literal["auto", "ddp", "ddp_spawn", "fsdp"]
Precision = Literal["auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true"]
Attention = Literal["llama", "mla"]


def names(choice: object) -> tuple[str, ...]:
    """The values a `Literal` allows, in its order."""
    return typing.get_args(choice)


TRACKS = names(Track)
DATASET_SCHEMAS = names(DatasetSchema)
GENERATORS = names(Generator)
LENGTH_POLICIES = names(LengthPolicy)
ENDPOINT_STRATEGIES = names(EndpointStrategy)
OVERLENGTH_POLICIES = names(Overlength)
ANSWER_IDS = names(AnswerIds)
EXTRACT_BACKENDS = names(ExtractBackend)
STORAGE_FORMATS = names(StorageFormat)
HIDDEN_STATE_MODES = names(HiddenStates)
OUT_OF_VOCAB_POLICIES = names(OutOfVocab)
TEACHERS = names(Teacher)
LOSSES = names(Loss)
STEP_WEIGHTS = names(StepWeights)
TTT_CHAINS = names(TttChains)
LR_SCHEDULES = names(LrSchedule)
STRATEGIES = names(Strategy)
PRECISIONS = names(Precision)
ATTENTIONS = names(Attention)
