"""Labels for model folders and data files that never merge two of them.

Each is known by its resolved path and labelled by the shortest tail of that path that no other one shares ("a/bi" and
"b/bi" where both end in "bi"). Results are dicts keyed by label, so two things under one label would silently keep
only the last one's numbers."""

from __future__ import annotations

from pathlib import Path


def resolved(path: str) -> str:
    """The absolute, symlink-free path of a local file or folder; anything else (a Hub id) as given."""
    local = Path(path).expanduser()
    return str(local.resolve()) if local.exists() else path


def refuse_repeats(given: list[str], flag: str) -> list[str]:
    """`given` resolved, refusing in one line two that name the same file or folder (their rows would be counted
    twice, under two labels)."""
    seen: dict[str, str] = {}
    for item in given:
        where = resolved(item)
        if where in seen:
            raise ValueError(f"{flag} {seen[where]} and {flag} {item} name the same {where}: give it once")
        seen[where] = item
    return list(seen)


def _tail(path: str, parts: int, stem: bool) -> str:
    names = Path(path).parts[-parts:]
    last = names[-1].split(".")[0] if stem else names[-1]
    return "/".join([*names[:-1], last])


def distinct_labels(paths: list[str], stem: bool = False, fixed: dict[int, str] | None = None) -> list[str]:
    """One label per path: its last part (without extensions with `stem`), grown by parent folders for every path
    whose label another shares, until none does. `fixed`: labels by position that never grow (a built-in subset's
    name), so a file that shares one grows instead."""
    fixed = fixed or {}
    parts = [1] * len(paths)
    while True:
        labels = [fixed.get(i) or _tail(p, parts[i], stem) for i, p in enumerate(paths)]
        shared = [i for i, label in enumerate(labels) if labels.count(label) > 1 and i not in fixed]
        grown = [i for i in shared if parts[i] < len(Path(paths[i]).parts)]
        if not grown:
            return labels
        for i in grown:
            parts[i] += 1
