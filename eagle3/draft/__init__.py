"""The EAGLE-3 draft: model math, training-time test, target weights it borrows, export, eval."""
