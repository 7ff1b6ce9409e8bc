"""``hybrid ablate``'s report: ``hybrid fit`` runs gathered into tables, their seeds pooled, and a Pareto plot.

- :mod:`~hybrid.report.runs` finds run folders and makes each one a row (settings, test metrics, size,
  training clock, decoding speed timed with the benchmark's loop);
- :mod:`~hybrid.report.seeds` pools the seeds of one configuration and says when two configurations differ;
- :mod:`~hybrid.report.tables` writes the Markdown tables;
- :mod:`~hybrid.report.plot` draws the Pareto plot of error rate against decoding speed;
- :mod:`~hybrid.report.files` writes the report's files and reads its CSVs back.

Checks of one study's targets (which arm must come within how much of which) belong to that study's results
script, beside its tables (``results/ablations/targets.py``), not here.
"""
