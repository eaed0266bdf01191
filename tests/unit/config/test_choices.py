"""The valid values of each choice live once (eagle3.config.choices); the code that acts on a choice spells
the same names, so a name added on one side only is caught here, not by a user's run."""

from __future__ import annotations

import pytest

from eagle3.config import choices
from eagle3.data import conversation, render
from eagle3.data.adapters import ADAPTERS
from eagle3.demo import datasets
from eagle3.draft import options
from eagle3.engines import IN_PROCESS, SGLANG, VLLM
from eagle3.generation import http_settings, regenerate


@pytest.mark.parametrize(("valid", "acted_on"), [
    (choices.TRACKS, {conversation.TRACK_TARGET_NATIVE, conversation.TRACK_PROMPT_ONLY}),
    (choices.DATASET_SCHEMAS, set(ADAPTERS)),
    (choices.GENERATORS, {datasets.DEMO_NATIVE, datasets.DEMO_PROMPTS}),
    (choices.LENGTH_POLICIES, {regenerate.LENGTH_KEEP_FLAGGED, regenerate.LENGTH_DROP}),
    (choices.ENDPOINT_STRATEGIES, {http_settings.LEAST_BUSY, http_settings.ROUND_ROBIN}),
    (choices.OVERLENGTH_POLICIES, {render.OVERLENGTH_TRUNCATE, render.OVERLENGTH_DROP}),
    (choices.ANSWER_IDS, {render.ANSWER_IDS_EMITTED, render.ANSWER_IDS_REENCODED}),
    (choices.EXTRACT_BACKENDS, {IN_PROCESS, VLLM, SGLANG}),
    (choices.HIDDEN_STATE_MODES, {options.STORE, options.ONLINE, options.HYBRID}),
    (choices.OUT_OF_VOCAB_POLICIES, {options.OOV_MASK, options.OOV_KEEP}),
    (choices.TEACHERS, {options.TEACHER_DRAFT_VOCAB, options.TEACHER_FULL_VOCAB}),
    (choices.LOSSES, {options.LOSS_KL, options.LOSS_TV, options.LOSS_JSD, options.LOSS_NLA, options.LOSS_LK}),
    (choices.STEP_WEIGHTS, {options.STEP_WEIGHTS_DECAY, options.STEP_WEIGHTS_DPACE}),
    (choices.TTT_CHAINS, {options.TTT_CHAINS_ALL, options.TTT_CHAINS_ON_POLICY, options.TTT_CHAINS_RESCORED}),
    (choices.ATTENTIONS, {options.ATTENTION_LLAMA, options.ATTENTION_MLA}),
])
def test_each_valid_value_is_one_the_code_acts_on_and_no_other(valid, acted_on):
    assert len(set(valid)) == len(valid)
    assert set(valid) == acted_on


def test_every_storage_format_has_its_byte_arithmetic():
    from eagle3.states.formats import FORMATS, bytes_per_token, tensor_names

    assert FORMATS == choices.STORAGE_FORMATS
    for fmt in FORMATS:
        assert bytes_per_token(fmt, 64, 3) > 0 and tensor_names(fmt)
