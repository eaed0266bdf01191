"""Every report a stage writes, rendered from plain data: markdown, PNG plots, and the loggers.

One module per report -- `eval` (stage eval), `bench` (stage bench), `sweep` (stage report and
the end-of-sweep callback), `plan` (stage plan) -- over three shared helpers: `files` (the
JSON / markdown / PNG files, written atomically), `figures` (matplotlib figures without pyplot
or a display) and `loggers` (one call that logs a report to the job's experiment loggers).

A renderer takes the report as plain data (what its JSON file holds) and never reaches back into
the stage or package that assembled it, so what is printed, written and logged cannot drift.
"""
