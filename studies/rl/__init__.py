"""Outcome, min-score and process GRPO (l2r, bi) from one SFT policy on the synthetic task (README.md)."""
