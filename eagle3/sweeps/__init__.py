"""Sweeps: the record each job leaves (`jobs`), a sweep's report as data (`collect`), the recipes of a
sweep with their seeds pooled (`variants`), the data-scale curve (`scale_curve`) and the rules of
`stage=report` (`rules`). The Hydra callback that reports a multirun when it ends is
`eagle3.cli.ReportOnSweepEnd` (the Hydra side).
"""
