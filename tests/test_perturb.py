import copy

import pytest

from biprm.data.perturb import FILLERS, insert_noise, merge_steps, mix_seed, perturb, perturb_dataset, split_step
from biprm.data.trajectory import Trajectory, labels_from_first_error


class Fixed:
    """An rng stand-in that draws position k and the first filler."""

    def __init__(self, k):
        self.k = k

    def randrange(self, n):
        return self.k

    def randint(self, a, b):
        return self.k

    def choice(self, seq):
        return self.k if self.k in seq else seq[0]


def traj(first_error, steps=("A one. A two.", "B", "C three", "D")):
    steps = list(steps)
    return Trajectory("q?", steps, labels_from_first_error(first_error, len(steps)), meta={"id": 7})


@pytest.mark.parametrize(
    "f, t, expected",
    [
        (2, 1, 1),  # merge (1,2) holds the error -> merged step 1
        (2, 2, 2),  # merge (2,3) holds the error -> merged step 2
        (2, 0, 1),  # merge before the error shifts it -1
        (1, 2, 1),  # merge after the error keeps it
        (-1, 0, -1),
    ],
)
def test_merge_remap(f, t, expected):
    out = merge_steps(traj(f), Fixed(t))
    assert len(out.steps) == 3
    assert out.meta["first_error"] == expected and out.first_error == expected
    assert out.labels == labels_from_first_error(expected, 3)
    assert out.meta["perturbation"] == {"kind": "merge", "step": t}


def test_merge_text():
    out = merge_steps(traj(2), Fixed(1))
    assert out.steps == ["A one. A two.", "B C three", "D"]


@pytest.mark.parametrize(
    "f, t, expected",
    [
        (0, 0, 0),  # split of the error step -> its first half is the error
        (2, 0, 3),  # split before the error shifts it +1
        (0, 2, 0),  # split after the error keeps it
        (-1, 2, -1),
    ],
)
def test_split_remap(f, t, expected):
    steps = ("A one. A two.", "B c", "C d. E f.", "D")
    out = split_step(traj(f, steps), Fixed(t))
    assert len(out.steps) == 5
    assert out.meta["first_error"] == expected
    assert out.labels == labels_from_first_error(expected, 5)


def test_split_text():
    # sentence breaks win over plain spaces; steps 0 and 2 have one, Fixed(2) picks step 2
    out = split_step(traj(2, ("A one. A two.", "B c", "C d. E f.", "D")), Fixed(2))
    assert out.steps == ["A one. A two.", "B c", "C d.", "E f.", "D"]
    # no sentence break anywhere: cut at the space nearest the middle ("x =" | "3 + 4", ties go left)
    out = split_step(traj(-1, ("x = 3 + 4", "done")), Fixed(0))
    assert out.steps == ["x =", "3 + 4", "done"]
    with pytest.raises(ValueError):
        split_step(traj(-1, ("a", "b")), Fixed(0))


@pytest.mark.parametrize(
    "f, p, expected, noise_label",
    [
        (2, 1, 3, 1.0),  # filler before the error shifts it +1 and is right
        (2, 2, 3, 1.0),  # right in front of the error step
        (2, 3, 2, 0.0),  # after the error: labelled wrong
        (2, 4, 2, 0.0),  # appended at the end
        (-1, 2, -1, 1.0),  # clean trajectory: filler is right
    ],
)
def test_noise_remap(f, p, expected, noise_label):
    out = insert_noise(traj(f), Fixed(p))
    assert out.steps[p] == FILLERS[0] and len(out.steps) == 5
    assert out.meta["first_error"] == expected
    assert out.labels[p] == noise_label
    assert out.labels == labels_from_first_error(expected, 5)


def test_first_error_from_meta_when_unlabelled():
    t = Trajectory("q?", ["a", "b", "c"], meta={"first_error": 1})
    out = merge_steps(t, Fixed(0))
    assert out.meta["first_error"] == 0 and out.labels == [0.0, 0.0]


def test_input_not_mutated():
    t = traj(2)
    before = copy.deepcopy(t)
    for seed in range(20):
        perturb(t, seed)
    assert t == before and "perturbation" not in t.meta


def test_perturb_is_deterministic():
    t = traj(2)
    assert perturb(t, 5) == perturb(t, 5)
    assert perturb(t, 5, kinds=("noise",)).meta["perturbation"]["kind"] == "noise"
    # a single step with no inner space: only noise applies
    assert perturb(Trajectory("q", ["x"], [1.0]), 0).meta["perturbation"]["kind"] == "noise"
    with pytest.raises(ValueError):
        perturb(t, 0, kinds=("shuffle",))


def test_perturb_dataset():
    rows = [traj(f) for f in (-1, 0, 1, 2, 3) * 8]
    a, b = perturb_dataset(rows, seed=0), perturb_dataset(rows, seed=0)
    assert a == b
    assert a[3] == perturb(rows[3], mix_seed(0, 3))
    assert a != perturb_dataset(rows, seed=1)
    kinds = {r.meta["perturbation"]["kind"] for r in a}
    assert kinds == {"merge", "split", "noise"}
    for orig, new in zip(rows, a):
        f, g = orig.first_error, new.first_error
        assert (f == -1) == (g == -1)
        if f >= 0:
            # the new first-error step holds the old one (merge), lies inside it (split) or equals it (noise)
            old, now = orig.steps[f], new.steps[g]
            assert old in now or now in old
