"""ProcessBench: find the first wrong step (or say there is none) in 3,400 labelled solutions.

Prediction = the first step whose fused probability is below the threshold, else −1.
Scores per subset: accuracy on erroneous rows (exact index), on clean rows (−1), and
their harmonic mean F1; the headline is the mean F1 over subsets.

Thresholds: 0.5 (the reference code's), and with `tune` one chosen where it is not
reported. ProcessBench's authors tune on the GSM8K subset and report GSM8K too; here the
GSM8K rows are split in two halves by question and each half is predicted with the
threshold tuned on the other (cross-fitting), while the other subsets use the threshold
tuned on all GSM8K rows. Rows with no GSM8K subset among them (a user's own file) are
cross-fitted within themselves the same way. With a dev set (`dev`, e.g. `--tune-data
FILE`), its threshold is used everywhere instead. The in-sample threshold appears only as an upper bound.
Content-free rows stand beside: flag nothing, flag step 0, and "flag step k when there
are more than k steps" with k chosen on the same tuning rows as the threshold.

With `--segmenter NAME` each row's given steps are laid end to end with a blank line between them (the layout they
came with), cut again by that segmenter and scored in those pieces; the scores map back to the given steps
(`analysis.boundaries.onto_given`), so every number reads the given labels and compares across segmenters.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from biprm.analysis.boundaries import laid_out, onto_given
from biprm.analysis.common import TITLES, first_errors, judged_rows, markdown_table, subsets
from biprm.data.segment import JOIN
from biprm.data.trajectory import Trajectory
from biprm.evaluation.ledger import format_ledger, ledger, scorable
from biprm.evaluation.outputs import fmt, open_cache, provenance, write_outputs
from biprm.evaluation.config import ProcessBenchConfig
from biprm.data.benchmarks import load_processbench, processbench_files
from biprm.evaluation.models import ScoreSource, models_given, score_sources, sources_of
from biprm.evaluation.cache import ScoreCache
from biprm.scoring.score_file import trace_segmenter
from biprm.metrics.first_error import (
    first_error_f1_by_subset,
    flag_step,
    predict_first_error,
    tune_flag_step,
    tune_threshold,
)
from biprm.metrics.bootstrap import question_clusters
from biprm.scoring.step_scores import StepScores

TUNE_ON = "gsm8k"
RESAMPLES = 1000  # bootstrap resamples behind the commands' F1 intervals


def tuned_threshold(trajs: list[Trajectory], scores: StepScores) -> tuple[float, float]:
    """(threshold, its F1) on these rows; a row whose first error lies in steps cut at max_length is left out."""
    part, first = judged_rows(trajs, scores)
    return tune_threshold(part.prob(), part.offsets, first)


def _n_steps(trajs: list[Trajectory]) -> np.ndarray:
    return np.array([len(t.steps) for t in trajs])


IN_FILE = "these rows"  # what a threshold is tuned on when no GSM8K row is present: the rows themselves, cross-fitted


def _tuning_rows(trajs: list[Trajectory]) -> tuple[np.ndarray, str]:
    """(the rows choices are made on, their name): the GSM8K subset where present (ProcessBench's convention), else
    every row, so that a user's own file gets the same out-of-sample rows as the built-in sets (issue 48)."""
    rows = np.flatnonzero(subsets(trajs) == TUNE_ON)
    return (rows, TUNE_ON) if len(rows) else (np.arange(len(trajs)), IN_FILE)


def question_ids(trajs: list[Trajectory]) -> np.ndarray:
    """Each row's question (`bootstrap.question_clusters`): the unit that intervals resample and folds keep whole."""
    return question_clusters([t.question for t in trajs])


def question_halves(trajs: list[Trajectory], rows: np.ndarray, first: np.ndarray) -> list[np.ndarray]:
    """Two folds over questions: alternating within clean and within erroneous rows (so each fold has both), with
    every row of a question (`question_ids`, the intervals' clusters) in the fold of its first row, so no question is
    predicted by a choice made on it."""
    fold_of: dict[int, int] = {}
    fold = np.empty(len(rows), dtype=np.int64)
    questions = question_ids(trajs)
    for clean in (True, False):
        count = 0
        for i in np.flatnonzero((first[rows] == -1) == clean):
            question = int(questions[rows[i]])
            if question not in fold_of:
                fold_of[question], count = count % 2, count + 1
            fold[i] = fold_of[question]
    return [np.sort(rows[fold == f]) for f in (0, 1)]


Choice = Callable[[np.ndarray], object]  # tuning rows -> a choice (a threshold, a k)
Apply = Callable[[object], np.ndarray]  # a choice -> a prediction for every row


def cross_fitted(trajs: list[Trajectory], choose: Choice, apply: Apply) -> tuple[np.ndarray, object, list]:
    """(predictions, the choice made on all tuning rows, the choice of each half) where no tuning row is predicted
    with a choice made on it: each half of the tuning rows (`_tuning_rows`, split by `question_halves`) is predicted
    with the choice made on the other; every other row with the choice made on all tuning rows. Tuning rows get
    -2 (not measured) when there are too few to split."""
    (rows, _), first = _tuning_rows(trajs), first_errors(trajs)
    choice = choose(rows)
    pred = apply(choice).copy()
    halves = question_halves(trajs, rows, first)
    if any(len(np.unique(first[h] == -1)) < 2 for h in halves):  # a half without clean or without erroneous rows
        pred[rows] = -2
        return pred, choice, []
    folds = []
    for tune, other in (halves, halves[::-1]):
        folds.append(choose(tune))
        pred[other] = apply(folds[-1])[other]
    return pred, choice, folds


def flag_step_rule(trajs: list[Trajectory], dev: list[Trajectory] | None = None, resamples: int = 0) -> dict:
    """ "Flag step k when there are more than k steps", k tuned on `dev`, else cross-fitted (`cross_fitted`): a
    content-free row."""
    first, n_steps = first_errors(trajs), _n_steps(trajs)
    if dev is not None:
        k, _ = tune_flag_step(_n_steps(dev), first_errors(dev))
        return {"k": k, "tuned_on": "dev", **_report(flag_step(n_steps, k), trajs, resamples)}
    pred, k, folds = cross_fitted(
        trajs, lambda rows: tune_flag_step(n_steps[rows], first[rows])[0], lambda k: flag_step(n_steps, k)
    )
    return {"k": k, "tuned_on": _tuning_rows(trajs)[1], "folds": folds, **_report(pred, trajs, resamples)}


def out_of_sample(
    trajs: list[Trajectory],
    scores: StepScores,
    dev: tuple[list[Trajectory], StepScores] | None = None,
    resamples: int = 0,
) -> dict:
    """{"threshold", "tuned_on", ...report}: F1 per subset where no row is predicted with a threshold tuned on it (see
    module doc)."""
    probs = scores.prob()
    predict = lambda t: predict_first_error(probs, scores.offsets, t)  # noqa: E731
    if dev is not None:
        t, _ = tuned_threshold(*dev)
        return {"threshold": t, "tuned_on": "dev", **_report(predict(t), trajs, resamples)}
    choose = lambda rows: tuned_threshold([trajs[i] for i in rows], scores.select(rows))[0]  # noqa: E731
    pred, t, folds = cross_fitted(trajs, choose, predict)
    return {
        "threshold": t,
        "tuned_on": _tuning_rows(trajs)[1],
        "folds": [{"threshold": f} for f in folds],
        **_report(pred, trajs, resamples),
    }


def _report(pred: np.ndarray, trajs: list[Trajectory], resamples: int = 0) -> dict:
    """`first_error_f1_by_subset` (with intervals from `resamples` over the rows' questions), rows predicted -2 (no
    out-of-sample choice possible) counting as not measured."""
    where = subsets(trajs)
    report = first_error_f1_by_subset(pred, first_errors(trajs), where, resamples, clusters=question_ids(trajs))
    unmeasured = np.unique(where[pred == -2])
    nan = float("nan")
    for name in unmeasured:
        report["subsets"][str(name)] |= {"acc_error": nan, "acc_correct": nan, "f1": nan}
        report["subsets"][str(name)] |= {"f1_interval": [nan, nan]} if resamples else {}
    report["average_f1"] = float(np.mean([s["f1"] for s in report["subsets"].values()]))
    if resamples and len(unmeasured):
        report["average_f1_interval"] = [nan, nan]
    return report


def evaluate_processbench(
    trajs: list[Trajectory],
    scores: dict[str, StepScores],
    threshold: float = 0.5,
    tune: bool = False,
    dev: tuple[list[Trajectory], dict[str, StepScores]] | None = None,
    resamples: int = 0,
) -> dict:
    """Per mode: "fixed" (at `threshold`) and, with `tune` or `dev`, "tuned" (out of sample) and "in_sample" (an upper
    bound); with `resamples`, every F1 with a 95 % interval over questions (`first_error_f1_by_subset`, the rows of a
    question drawn together); "ledger" says what the tables stand on (`ledger.ledger`): every row read, and the rows
    every model scored, which alone the tables read (`on_scorable`)."""
    book = ledger(trajs, subsets(trajs), scores)
    trajs, scores = on_scorable(trajs, scores)
    dev = None if dev is None else on_scorable(*dev)
    modes, where, first = {}, subsets(trajs), first_errors(trajs)
    # rows without GSM8K rows (a user's own file) are cross-fitted within themselves, where they hold both kinds of row
    in_file = dev is None and TUNE_ON not in where and len(np.unique(first == -1)) == 2

    def at(s: StepScores, t: float) -> dict:
        return _report(predict_first_error(s.prob(), s.offsets, t), trajs, resamples)

    for key, s in scores.items():
        modes[key] = {"fixed": at(s, threshold)}
        if tune or dev is not None or in_file:
            modes[key]["tuned"] = out_of_sample(trajs, s, None if dev is None else (dev[0], dev[1][key]), resamples)
            if len(np.unique(judged_rows(trajs, s)[1] == -1)) == 2:  # tuning needs clean and erroneous rows
                t, f1 = tuned_threshold(trajs, s)
                modes[key]["in_sample"] = {"threshold": t, "tuning_f1": f1, **at(s, t)}
    names = list(dict.fromkeys(where))
    baselines = {  # what a verifier must beat: flag nothing, or flag every solution at its first step
        "always -1 (no error)": _report(np.full(len(trajs), -1), trajs, resamples),
        "always step 0": _report(np.zeros(len(trajs), dtype=np.int64), trajs, resamples),
    }
    if dev is not None or TUNE_ON in where or in_file:
        rule = flag_step_rule(trajs, None if dev is None else dev[0], resamples)
        k = chosen("k", rule["k"], rule.get("folds", []), rule["tuned_on"], str)
        baselines[f"flag step k when there are more than k steps ({k})"] = rule
    return {
        "threshold": threshold,
        "resamples": resamples,
        "subsets": names,
        "rows": {n: int((where == n).sum()) for n in names},
        "questions": {n: len(np.unique(question_ids(trajs)[where == n])) for n in names},
        "modes": modes,
        "baselines": baselines,
        "ledger": book,
    }


def on_scorable(
    trajs: list[Trajectory], scores: dict[str, StepScores]
) -> tuple[list[Trajectory], dict[str, StepScores]]:
    """The rows every model could score (`ledger.scorable`), with their scores: a row one model cannot read at all
    leaves every table row, so models and text-free rules compare on the same rows."""
    keep = scorable(trajs, scores)
    if len(keep) == len(trajs):
        return trajs, scores
    return [trajs[i] for i in keep], {k: s.select(keep) for k, s in scores.items()}


def chosen(name: str, value: object, folds: list, tuned_on: str, spell: Callable[[object], str]) -> str:
    """What a tuned row was predicted with, in words: the value itself only where every row used it; where halves
    were cross-fitted, each half's value, since no row of that part was predicted with the value tuned on all."""
    halves = " and ".join(spell(f) for f in folds)
    if tuned_on == "dev":
        return f"{name} = {spell(value)}, tuned on a dev set"
    if tuned_on == TUNE_ON:
        gsm8k = f"GSM8K's halves at {halves}, each tuned on the other" if folds else "GSM8K too small to cross-fit"
        return f"{name} = {spell(value)} tuned on GSM8K, for the other subsets; {gsm8k}"
    if folds:
        return f"{name} = {halves}: cross-fitted, each half of these rows (by question) at the value tuned on the other"
    return f"{name}: too few rows to cross-fit, not measured"


def _f1(report: dict, key: str) -> str:
    """An F1 cell: the value, and its interval where the report has one."""
    low, high = report.get(f"{key}_interval") or (None, None)
    return fmt(report[key]) + (f" [{fmt(low)}, {fmt(high)}]" if fmt(low) != "–" and fmt(high) != "–" else "")


def format_processbench(result: dict) -> str:
    """F1 per subset at the fixed and the tuned threshold, then the two accuracies behind each F1."""
    names, modes = result["subsets"], result["modes"]
    heads = [TITLES.get(n, n) for n in names]
    f1_row = lambda r: [_f1(r["subsets"][n], "f1") for n in names] + [_f1(r, "average_f1")]  # noqa: E731
    rows = [[f"{key} @ {result['threshold']:g}", *f1_row(m["fixed"])] for key, m in modes.items()]

    def threshold(tuned: dict) -> str:
        folds = [f["threshold"] for f in tuned.get("folds", [])]
        return chosen("threshold", tuned["threshold"], folds, tuned["tuned_on"], lambda t: f"{t:.3f}")

    rows += [[f"{key} @ {threshold(m['tuned'])}", *f1_row(m["tuned"])] for key, m in modes.items() if "tuned" in m]
    rows += [
        [
            f"{key} @ {m['in_sample']['threshold']:.3f} (in sample: an upper bound, not a result)",
            *f1_row(m["in_sample"]),
        ]
        for key, m in modes.items()
        if "in_sample" in m
    ]
    rows += [[f"baseline: {key}", *f1_row(b)] for key, b in result.get("baselines", {}).items()]
    both = lambda s: f"{fmt(s['acc_error'])} / {fmt(s['acc_correct'])}"  # noqa: E731
    acc = [
        [f"{key} @ {result['threshold']:g}", *(both(m["fixed"]["subsets"][n]) for n in names)]
        for key, m in modes.items()
    ]
    acc += [
        [f"baseline: {key}", *(both(b["subsets"][n]) for n in names)] for key, b in result.get("baselines", {}).items()
    ]
    sizes = ", ".join(f"{TITLES.get(n, n)} {k}" for n, k in result["rows"].items())
    resamples = result.get("resamples")
    questions = result.get("questions", result["rows"])
    intervals = (
        f", with 95 % intervals from {resamples} resamples of the questions within each subset (all rows of a question "
        "drawn together; questions: " + ", ".join(f"{TITLES.get(n, n)} {k}" for n, k in questions.items()) + ")"
        if resamples
        else ""
    )
    return (
        f"Rows: {sizes}. F1 (%){intervals}:\n\n"
        + markdown_table(["mode", *heads, "Avg. F1"], rows)
        + "\n\nAccuracy on erroneous / clean rows (%):\n\n"
        + markdown_table(["mode", *heads], acc)
        + (f"\n\n{format_ledger(result['ledger'])}" if "ledger" in result else "")
    )


def recut_scores(
    sources: list[ScoreSource], cache: ScoreCache, trajs: list[Trajectory], segmenter
) -> dict[str, StepScores]:
    """Each source's scores of the rows' given steps re-cut by `segmenter` (None: as given), on the given steps."""
    if segmenter is None:
        return score_sources(sources, cache, trajs)
    laid = [laid_out(t.steps, JOIN) for t in trajs]
    cuts = [segmenter.cut(text, f"row {t.meta.get('id', i)}") for i, ((text, _), t) in enumerate(zip(laid, trajs))]
    pieces = [Trajectory(t.question, c.texts, meta=t.meta | c.meta()) for t, c in zip(trajs, cuts)]
    scores = score_sources(sources, cache, pieces)
    return {k: onto_given(s, [c.offsets for c in cuts], [spans for _, spans in laid]) for k, s in scores.items()}


def run_processbench(cfg: ProcessBenchConfig) -> dict:
    cache = open_cache(cfg)
    trajs = load_processbench(cfg.data_root, cfg.data or cfg.subsets, cfg.limit)
    sources = sources_of(cfg.model, cfg.prm_kind)
    segmenter = None if cfg.segmenter in (None, "given") else trace_segmenter(cfg.model, cfg.segmenter)
    dev = None
    if cfg.tune_data:
        dev_trajs = load_processbench(cfg.data_root, (cfg.tune_data,))
        dev = (dev_trajs, recut_scores(sources, cache, dev_trajs, segmenter))
    scores = recut_scores(sources, cache, trajs, segmenter)
    result = evaluate_processbench(trajs, scores, cfg.threshold, cfg.tune_threshold, dev, RESAMPLES)
    result["segmenter"] = segmenter.name if segmenter else "given"
    result["models"] = models_given(cfg.model, cfg.prm_kind)
    result["files"] = {k: str(v) for k, v in processbench_files(cfg.data_root, cfg.data or cfg.subsets).items()}
    steps = (
        f"Steps: each row's given steps joined by a blank line and cut again by `{segmenter.name}`; each first error "
        "maps back to the given step that holds its first character.\n\n"
        if segmenter
        else ""
    )
    markdown = "# ProcessBench\n\n" + provenance(result["models"], result["files"]) + steps
    markdown += format_processbench(result) + "\n"
    print(markdown)
    print(f"wrote {write_outputs(cfg.out, 'processbench', result, markdown)} and processbench.json")
    return result
