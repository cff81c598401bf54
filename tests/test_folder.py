"""One resolution of what a model folder is: every command reads its answer, and only biprm.folder reads config.json."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from prm_replicas import build

import biprm.folder
from biprm.folder import NotACheckpoint, resolve
from biprm.prms import UnknownPRM

PACKAGE = Path(biprm.folder.__file__).parent


@pytest.fixture(scope="module")
def llama_and_mistral(tmp_path_factory):
    """A Llama 3-style causal LM (the rlhflow replica) and a Mistral one (math-shepherd's), each with its tokenizer."""
    root = tmp_path_factory.mktemp("kinds")
    return build("rlhflow", root / "llama-lm"), build("math-shepherd", root / "mistral-lm")


def test_a_kind_that_does_not_fit_its_tokenizer_is_named_before_any_weight_loads(llama_and_mistral, monkeypatch):
    """Before: rlhflow on a Mistral folder scored Llama's special-token strings as plain text, and math-shepherd on a
    Llama folder was refused as if a data row were wrong ("step 0 does not end with the math-shepherd tag")."""
    import biprm.modeling

    llama, mistral = llama_and_mistral
    monkeypatch.setattr(biprm.modeling.AutoModel, "_model_mapping", None)  # any weight load would fail loudly
    with pytest.raises(UnknownPRM, match=r"not a rlhflow tokenizer: it lacks <\|begin_of_text\|>, <\|start_header_id"):
        resolve(mistral, "rlhflow").tokenizer
    with pytest.raises(UnknownPRM, match="not a math-shepherd tokenizer: its step tag ' ки' after a step's text"):
        resolve(llama, "math-shepherd").tokenizer
    assert resolve(llama, "rlhflow").tokenizer.pad_token and resolve(mistral, "math-shepherd").tokenizer.pad_token


def test_a_folder_is_resolved_with_everything_a_command_needs(llama_and_mistral, tmp_path):
    llama, _ = llama_and_mistral
    folder = resolve(llama, "rlhflow")
    assert (folder.kind, folder.mode, folder.trained_elsewhere, folder.implicit) == ("rlhflow", "l2r", True, False)
    assert folder.template.kind == "rlhflow" and folder.window == 4096 and folder.spec.aggregation == "mean"
    assert folder.reading("bi-static").mode == "bi-static"
    with pytest.raises(ValueError, match="has no trained gate"):
        folder.reading("bi")
    hub = resolve("someone/some-prm")  # left to the Hub: nothing local to read
    assert (hub.kind, hub.local) == ("biprm", False)
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["BiPRMForStepScoring"], "biprm": {"mode": "bi"}})
    )
    assert (resolve(export).kind, resolve(export).mode) == ("export", "bi")
    with pytest.raises(ValueError, match="an export in mode bi, which it keeps"):
        resolve(export, prm_mode="l2r")
    with pytest.raises(NotACheckpoint, match="holds list, not a model config"):
        (tmp_path / "list").mkdir()
        (tmp_path / "list" / "config.json").write_text("[]")
        resolve(tmp_path / "list")


def _reads_of_config(tree: ast.AST) -> list[int]:
    """Lines that parse a config.json (json.load(s) of an expression naming it, or of a name bound to such a path)."""
    bound = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and "config.json" in ast.unparse(node.value)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("json.loads", "json.load"):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if "config.json" in ast.unparse(node) or names & bound:
                lines.append(node.lineno)
    return lines


def test_only_biprm_folder_reads_a_model_config_or_works_out_a_kind():
    """One place decides what a folder is: no other module parses a config.json or calls `detect`/`body_config`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "folder.py" and path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text())
        found += [f"{path.relative_to(PACKAGE)}:{line} parses config.json" for line in _reads_of_config(tree)]
        found += [
            f"{path.relative_to(PACKAGE)}:{node.lineno} calls {node.func.id}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "detect"
        ]
    assert not found, found
    planted = ast.parse('config = Path(p) / "config.json"\nkind = json.loads(config.read_text())["model_type"]\n')
    assert _reads_of_config(planted) == [2]  # the check sees a read through a bound name


def test_score_resolves_its_model_once(bi_scorer, tmp_path, monkeypatch):
    """The walk from `biprm score` to the scorer reads the model's config.json once (it read it five times, and
    worked out its kind three times, before one resolution served them all)."""
    from biprm.cli import main

    model = tmp_path / "bi"
    bi_scorer.model.save_pretrained(model)
    bi_scorer.tokenizer.save_pretrained(model)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "1+1?", "steps": ["1+1=2", "The answer is 2."]}\n')
    reads, config = [], biprm.folder._config
    monkeypatch.setattr(biprm.folder, "_config", lambda folder, strict=True: reads.append(folder) or config(folder))
    main(["score", "--model", str(model), "--input", str(rows), "--output", str(tmp_path / "out.jsonl")])
    assert reads == [model] and len((tmp_path / "out.jsonl").read_text().splitlines()) == 1
