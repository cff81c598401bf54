"""The mechanism study's report, computed from the per-item logits that each run saved."""
from __future__ import annotations


def write_report(cfg) -> dict:
    return {}
