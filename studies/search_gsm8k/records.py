"""Keep the GSM8K study's progress in the repository, so that a study longer than one machine's life goes on elsewhere.

`save` copies the run's questions.jsonl, its settings and the batch in flight into
studies/search_gsm8k/results/gsm8k-study/,
gzipped, with every record's "question" and "gold" removed: benchmark text stays out of the repository, and
`biprm search` needs neither to resume or to summarise (it reads indices and grades). `restore` puts them back
into a fresh run folder. Both write whole files only (`atomic_write`).

    python -m studies.search_gsm8k.records save    # after a batch, and before the machine goes
    python -m studies.search_gsm8k.records restore # on a fresh machine, before the study starts
    python -m studies.search_gsm8k.records report  # summary.md, summary.json and accuracy.png again, from the records
    alone

`--run` and `--keep` name other folders (the same study on a GPU, studies/search_gsm8k/study_gpu.sh).
"""

import argparse
import gzip
import json
from pathlib import Path

from biprm.data.writer import atomic_write

RUN, KEEP = "runs/search/gsm8k-study", "studies/search_gsm8k/results/gsm8k-study"
FILES = {
    "questions.jsonl": "records.jsonl.gz",
    "batch-in-flight.json": "batch-in-flight.json.gz",
    "settings.json": "settings.json",
}


def strip(text: str) -> str:
    """questions.jsonl without the benchmark's text; a last line cut by a kill is left out, as a resume drops it."""
    lines = [json.loads(line) for line in text.split("\n")[:-1]]
    return "".join(json.dumps({k: v for k, v in r.items() if k not in ("question", "gold")}) + "\n" for r in lines)


def save(run: Path, keep: Path) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    for name, kept in FILES.items():
        source, target = run / name, keep / kept
        if not source.exists():
            target.unlink(missing_ok=True)  # a finished batch's checkpoint is gone: so is its copy
            continue
        data = source.read_text()
        data = strip(data) if name == "questions.jsonl" else data
        blob = gzip.compress(data.encode(), mtime=0) if kept.endswith(".gz") else data.encode()
        atomic_write(target, lambda f: f.write(blob))
    records = keep / FILES["questions.jsonl"]
    done = len(gzip.decompress(records.read_bytes()).splitlines()) if records.exists() else 0
    print(f"saved {done} questions to {keep}")


def restore(run: Path, keep: Path) -> None:
    run.mkdir(parents=True, exist_ok=True)
    if (run / "questions.jsonl").exists():
        raise SystemExit(f"{run / 'questions.jsonl'} exists: restore only into a fresh run folder")
    restored = [name for name, kept in FILES.items() if (keep / kept).exists()]
    for name in restored:
        data = (keep / FILES[name]).read_bytes()
        blob = gzip.decompress(data) if FILES[name].endswith(".gz") else data
        atomic_write(run / name, lambda f: f.write(blob))
    print(f"restored {', '.join(restored) or 'nothing (a fresh start)'} into {run} from {keep}")


def report(run: Path, keep: Path) -> None:
    """The study's summary rewritten from its kept records, with nothing else: its --report-only."""
    import tempfile

    from biprm.search.report import summarize

    with tempfile.TemporaryDirectory() as tmp:
        records = gzip.decompress((keep / FILES["questions.jsonl"]).read_bytes())
        atomic_write(Path(tmp, "questions.jsonl"), lambda f: f.write(records))
        summarize(Path(tmp))
        for name in ("summary.md", "summary.json", "accuracy.png"):
            data = Path(tmp, name).read_bytes()
            atomic_write(keep / name, lambda f: f.write(data))
    print(f"wrote the summary of {keep}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("save", "restore", "report"))
    parser.add_argument("--run", default=RUN, help="the study's run folder")
    parser.add_argument("--keep", default=KEEP, help="where its progress is kept in the repository")
    args = parser.parse_args()
    {"save": save, "restore": restore, "report": report}[args.action](Path(args.run), Path(args.keep))
