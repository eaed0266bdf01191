"""The train unit's report (`train_metrics.json`, the manifest's `extra`) as stage report and plan read it."""

from __future__ import annotations

import json

from eagle3.draft.fit import TrainMetrics


def _metrics(**changes) -> TrainMetrics:
    base = dict(global_step=10, epochs=1, train_samples=4, eval_samples=2, train_tokens_per_epoch=400,
                fit_wall_s=2.0, train_tokens_this_run=400, train_tokens_per_s=200.0, resumed_at_step=None,
                world_size=1, eval=None, geometry={"hidden_size": 64}, trainable_parameters=123,
                hidden_states="store")
    return TrainMetrics(**{**base, **changes})


def test_stored_states_report_no_state_source_and_online_ones_do():
    stored = _metrics().record()
    assert "states_source" not in stored and stored["hidden_states"] == "store"
    assert stored["train_tokens_per_s"] == 200.0 and json.loads(json.dumps(stored)) == stored
    online = _metrics(hidden_states="online", states_source=[{"tokens": 400}]).record()
    assert online["states_source"] == [{"tokens": 400}]
    assert list(online)[:3] == ["global_step", "epochs", "train_samples"]
