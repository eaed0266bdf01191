"""eagle3: raw chat data to a served, benchmarked EAGLE-3 draft model."""

__version__ = "0.1.0"
