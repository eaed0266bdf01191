"""What a config will cost before any of it runs: `figures` (counts with their basis, the size
arithmetic) and `chain` (the walk over every stage and unit that `stage=plan` prints)."""
