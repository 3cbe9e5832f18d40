"""The reproduction grid behind ``benchmarks/reproduce.py``: EffiR's and GAPrune's tables, row by row.

- ``rows``: what each row is (its stages, as recipe stage dicts) and the paper tables they fill;
- ``inputs``: what the stages read from outside the grid (base model, dense retriever, its training options),
  linked by content so a changed input never reuses stale stages;
- ``run``: a row's config fingerprint, running it as a recipe (resuming stage by stage), collecting its
  results JSON, listing the grid;
- ``render``: RESULTS.md from the results JSON files (tables with paired intervals, claim checks, figures).
"""
