"""Raw rows -> an encoded training set on Arrow, built once, cached on disk, memory-mapped.

A source is opened through the same door as the Python-list path (`readers.open_source`):
a local file is read by `datasets` into an Arrow table (a Hub dataset already is one).
`Dataset.map` then converts every row to a `Trajectory` with the same readers and
checks as everywhere else, and encodes it with the one template, in `num_proc`
processes. The result is cached under a fingerprint of the input, the format, the
tokenizer, `max_length` and the encoder version, so a second run, a `--resume` or
another rank of the same job maps the cached file instead of encoding again. No rank
holds the token ids as Python lists: rows are read from the memory-mapped table as
the data loader asks for them.
"""

from __future__ import annotations

import hashlib
import logging
import os
from functools import partial
from pathlib import Path

import datasets

from biprm.data.encoding import Encoded, Encoder
from biprm.data.readers import open_source, skip_report
from biprm.data.segment import Segmenter
from biprm.data.trajectory import DataError

log = logging.getLogger(__name__)
ENCODER_VERSION = "1"  # bump when the template or the encoder changes the tokens a row gives
FEATURES = datasets.Features(
    {
        "prompt": datasets.Sequence(datasets.Value("int32")),
        "steps": datasets.Sequence(datasets.Sequence(datasets.Value("int32"))),
        "labels": datasets.Sequence(datasets.Value("float64")),
        "n_dropped": datasets.Value("int32"),
        "n_tokens": datasets.Value("int32"),  # one stream: the length the batches are grouped by
        "row": datasets.Value("int64"),  # 1-based input row, for messages
        "error": datasets.Value("string"),  # why a row was skipped (--skip-invalid); empty for kept rows
    }
)


def _encode_rows(
    batch: dict[str, list], indices: list[int], *, convert, name: str, encoder: Encoder, skip_invalid: bool
) -> dict[str, list]:
    keys = list(batch)
    out: dict[str, list] = {k: [] for k in FEATURES}
    for i, values in zip(indices, zip(*batch.values())):
        where = f"{name} row {i + 1}"
        try:
            got = convert(dict(zip(keys, values)), where, i)
            encs = []
            for traj in got if isinstance(got, list) else [got]:
                if traj.labels is None:
                    raise DataError(f"{where}: field 'labels' is missing; training needs step labels")
                encs.append(encoder.encode(traj, where))
        except DataError as error:
            if not skip_invalid:
                raise
            encs, bad = [Encoded([], [], [])], str(error)
        else:
            bad = ""
        for e in encs:
            for key, value in (
                ("prompt", e.prompt),
                ("steps", e.steps),
                ("labels", e.labels),
                ("n_dropped", e.n_dropped),
                ("n_tokens", e.n_tokens),
                ("row", i + 1),
                ("error", bad),
            ):
                out[key].append(value)
    return out


def _fingerprint(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _tokenizer_id(encoder: Encoder) -> str:
    tok = encoder.tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else f"{tok.name_or_path}:{len(tok)}"
    return hashlib.sha256(text.encode()).hexdigest()


def encoded_dataset(
    source: str,
    encoder: Encoder,
    fmt: str = "auto",
    split: str = "train",
    skip_invalid: bool = False,
    num_proc: int | None = None,
    segmenter: Segmenter | None = None,
) -> datasets.Dataset:
    """Labelled rows of `source`, encoded (columns of FEATURES but `error`); bad rows raise, or are skipped and
    reported. `segmenter` cuts a row given as one string (default: the readers' auto rule); its name is part of the
    cache key."""
    segmenter = segmenter or Segmenter("auto")
    raw, name, fmt, columns, convert = open_source(source, fmt, split, segmenter, arrow=True)
    if num_proc is None:
        num_proc = min(os.cpu_count() or 1, 8) if len(raw) >= 20_000 else None
    key = _fingerprint(
        raw._fingerprint,
        fmt,
        str(skip_invalid),
        str(encoder.max_length),
        str(encoder.step_tag_id),
        str(encoder.prefix),
        _tokenizer_id(encoder),
        ENCODER_VERSION,
        repr((segmenter.name, segmenter.rule)),
    )
    encode = partial(_encode_rows, convert=convert, name=name, encoder=encoder, skip_invalid=skip_invalid)
    out = raw.map(
        encode,
        batched=True,
        batch_size=256,
        with_indices=True,
        remove_columns=columns,
        features=FEATURES,
        num_proc=num_proc if fmt != "synthetic" else None,
        new_fingerprint=key,
        desc=f"encoding {Path(name).name}",
    )
    _report(out, name, len(raw), encoder.max_length)
    if skip_invalid:
        out = out.filter(lambda e: not e, input_columns="error", new_fingerprint=_fingerprint(key, "kept"))
    return out.remove_columns("error")


def streamed_dataset(
    source: str,
    encoder: Encoder,
    fmt: str = "auto",
    split: str = "train",
    skip_invalid: bool = False,
    segmenter: Segmenter | None = None,
) -> datasets.IterableDataset:
    """`encoded_dataset` for data read as it is consumed (no full download, no cache, no length): rows are encoded
    on the fly; a skipped row is logged as it passes, since there is no end to count at."""
    raw, name, _, columns, convert = open_source(source, fmt, split, segmenter or Segmenter("auto"), streaming=True)
    encode = partial(_encode_rows, convert=convert, name=name, encoder=encoder, skip_invalid=skip_invalid)
    out = raw.map(encode, batched=True, batch_size=256, with_indices=True, remove_columns=columns, features=FEATURES)

    def kept(error: str) -> bool:
        if error:
            log.warning("skipped: %s", error)
        return not error

    return out.filter(kept, input_columns="error").remove_columns("error")


def _report(out: datasets.Dataset, name: str, n_rows: int, max_length: int) -> None:
    """Warn (never hide) how many rows were skipped, and why, and which rows lost trailing steps to max_length."""
    errors = [(row, e) for row, e in zip(out["row"], out["error"]) if e]
    if errors:
        log.warning(skip_report(name, errors, n_rows))
    cut = [row for row, n in zip(out["row"], out["n_dropped"]) if n]
    if cut:
        log.warning(
            "%s: %d rows exceed max_length=%d and lose trailing steps in both streams: rows %s%s",
            name,
            len(cut),
            max_length,
            ", ".join(map(str, cut[:10])),
            " ..." if len(cut) > 10 else "",
        )


def to_encoded(row: dict) -> Encoded:
    return Encoded(row["prompt"], row["steps"], row["labels"], row["n_dropped"])
