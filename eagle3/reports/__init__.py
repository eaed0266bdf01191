"""Every report a stage writes, rendered from plain data: markdown, PNG plots, and the loggers.

One module per report -- `eval_report` (stage eval), `bench_report` (stage bench), `sweep_report`
(stage report and the end-of-sweep callback), `plan_report` (stage plan) -- over `output` (the
table-cell rule, matplotlib figures without pyplot or a display, the JSON / markdown / PNG files
written atomically) and `loggers` (one call that logs a report to the job's experiment loggers).

A renderer takes the report as plain data (what its JSON file holds) and never reaches back into
the stage or package that assembled it, so what is printed, written and logged cannot drift.
"""
