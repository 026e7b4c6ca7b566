"""Data: shape suites (shapes), the dataset loader and schema (dataset), importers of
external measurements (importers), the data card (datacard) and row health (health).

May import pandas (and pyarrow through it); never torch at import.
"""
