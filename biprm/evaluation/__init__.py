"""Evaluation protocols of the paper on the real benchmark files, one module each.

bon (Best-of-N), processbench (first-error F1), ablations (the paper's ablation table)
and suite (`biprm eval all`: every protocol and analysis, written up as report.md).
Every score passes through cache.ScoreCache, keyed by model and dataset content.
"""
