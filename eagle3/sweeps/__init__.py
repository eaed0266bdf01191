"""Sweeps: the record each job leaves (`jobs`), a sweep's report as data (`collect`), the rules of
`stage=report` (`rules`) and the Hydra callback that reports a multirun when it ends (`callback`).

`eagle3.sweeps.ReportOnSweepEnd` is what an experiment YAML names under `hydra.callbacks`.
"""

from eagle3.sweeps.callback import ReportOnSweepEnd

__all__ = ["ReportOnSweepEnd"]
