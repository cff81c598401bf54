"""Token-budget batching (`biprm.packing.token_runs`), the one rule behind scoring, prompt-cache calls and the trunk
cache."""

import numpy as np

from biprm.packing import token_runs


def test_padded_runs_count_items_times_the_widest():
    sizes = [9, 7, 7, 3, 2, 2, 2]  # longest first, as the scorer sorts them
    runs = token_runs(sizes, 20)
    assert runs == [(0, 2), (2, 4), (4, 7)]  # 2 x 9, 2 x 7, 3 x 2
    assert all(b - a == 1 or (b - a) * max(sizes[a:b]) <= 20 for a, b in runs)


def test_real_token_runs_count_the_sum():
    assert token_runs([9, 7, 7, 3, 2, 2, 2], 20, padded=False) == [(0, 2), (2, 7)]  # 16, then 7 + 3 + 2 + 2 + 2


def test_an_item_over_the_budget_gets_a_run_of_its_own_and_none_means_one_run():
    assert token_runs(np.array([50, 3, 60]), 10) == [(0, 1), (1, 2), (2, 3)]
    assert token_runs([5, 5, 5], None) == [(0, 3)]
    assert token_runs([], 10) == []


def test_runs_start_where_asked():
    """A resumed trunk-cache build starts at the first trajectory not yet on disk."""
    assert token_runs([1, 2, 3, 4, 5], 8, start=2) == [(2, 4), (4, 5)]
