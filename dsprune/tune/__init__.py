"""Ray Tune sweeps over dsprune pipelines: ``space`` (knobs and domains), ``trial`` (one pipeline run),
``outcome`` (score, cost, constraints, Pareto front), ``sweep`` (the search, its table and plot)."""
