"""A PRM as vLLM loads it: the body's own flat config, naming our architecture.

vLLM sizes the KV cache and the layers from a flat config (hidden_size, num_hidden_layers,
...), while a biprm checkpoint nests them under `backbone_config`. The export writes the
body's config with `architectures = ["BiPRMForStepScoring"]`, the settings the plugin reads under
`biprm` (mode, step-tag id, PRM kind and its text layout, value-head shape), and
`io_processor_plugin = "biprm"` so `vllm serve` picks the IO processor itself.
Weights and tokenizer files are copied (or linked) as they are; the model maps `backbone.` to its body.

A PRM trained elsewhere (biprm.prms: Qwen2.5-Math-PRM, Skywork, math-shepherd, RLHFlow, token
classification) keeps its weight files too; its read-out, written as biprm's value head, goes
beside them in a file of the same format (`biprm_head.*`), and the plugin passes over the source's
own head tensors. It is read as shipped (l2r), or zero-shot reversed (r2l) or averaged with that
(bi-static): it has no gate to export until `biprm train --init-from` trains one.

The config names the dtype `vllm serve` runs the body in. Under vLLM's `--dtype auto` a pooling
model whose config says float32 runs in float16 (`_get_and_verify_dtype`), which can overflow and
does not give biprm's scores, so the export names bfloat16 (or float16) and fp32 is asked for on
vLLM's command line. The heads run in fp32 whatever the body's dtype.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from biprm.checkpoint import layout
from biprm.folder import ModelFolder, resolve
from biprm.run_folder import claim
from biprm.vllm_plugin import ARCHITECTURE, PLUGIN, SERVED_DTYPES

HEAD_FILE = "biprm_head"  # the value head of a PRM trained elsewhere, beside its weight files
SAFE_INDEX = "model.safetensors.index.json"  # vLLM loads only the safetensors files a folder's index names


def export_for_vllm(
    checkpoint: str | ModelFolder,
    out: str,
    link: bool = False,
    dtype: str = "bfloat16",
    prm_kind: str | None = None,
    mode: str | None = None,
    overwrite: bool = False,
) -> Path:
    """The export folder, whose config asks vLLM for `dtype`; with `link` its files are symbolic links to the
    checkpoint's (a scratch export). `checkpoint` is a biprm folder (it keeps its mode) or a PRM trained elsewhere, of
    the kind detected or named by `prm_kind`, read in `mode` (default l2r); or a folder already resolved."""
    from biprm.modeling import BiPRMConfig, prm_config
    from biprm.prms import read_out, weight_files

    if dtype not in SERVED_DTYPES:
        raise ValueError(
            f"--dtype {dtype}: vLLM keeps only {' or '.join(SERVED_DTYPES)} from an export; for float32 pass --dtype "
            "float32 to vllm serve"
        )
    folder = checkpoint if isinstance(checkpoint, ModelFolder) else resolve(checkpoint, prm_kind, mode)
    src, dst = Path(folder.path), Path(out)
    if dst.resolve() == src.resolve():
        raise ValueError(f"--out {out}: the export needs its own folder, not the checkpoint's")
    claim(dst, overwrite, "--out")  # another run's model there is replaced only with --overwrite, and said so
    if folder.kind == "export":
        raise ValueError(f"{src}: already an export for vLLM; serve it as it is")
    if folder.implicit:
        raise ValueError(
            f"{src}: an implicit PRM ({folder.kind}) has no value head to export (its score is a log-ratio to a "
            f"reference LM); serve it with `biprm serve --model {src} --engine vllm --prm-reference REFERENCE_LM`"
        )
    if folder.trained_elsewhere:
        tokenizer = folder.tokenizer
        config = prm_config(folder, tokenizer)
        head, skip = read_out(src, folder.spec, tokenizer), source_head_prefixes(folder.kind)
    else:
        config = BiPRMConfig.from_pretrained(src)
        head, skip = {}, []
    dst.mkdir(parents=True, exist_ok=True)
    flat = config.backbone_config.to_dict()
    flat.update(
        architectures=[ARCHITECTURE],
        dtype=dtype,
        io_processor_plugin=PLUGIN,
        biprm={
            "mode": config.mode,
            "step_tag_id": config.step_tag_id,
            "prm_kind": config.prm_kind,
            "value_head": config.value_head,
            "text_layout": layout(config.prm_kind),
            "skip_prefixes": skip,
        },
    )
    written = {"config.json"} | ({SAFE_INDEX} if head else set())
    for f in src.iterdir():
        if not f.is_file() or f.name in written:
            continue
        if link:
            (dst / f.name).symlink_to(f.resolve())
        else:
            shutil.copy2(f, dst / f.name)
    if head:
        _write_head(head, src, dst, safetensors=weight_files(src)[0].suffix == ".safetensors")
    (dst / "config.json").write_text(json.dumps(flat, indent=2, default=str) + "\n")
    return dst


def source_head_prefixes(kind: str) -> list[str]:
    """State-dict prefixes of a source PRM's own read-out (and any LM head), which its value head replaces in the
    export."""
    from biprm.prms import KINDS

    names = {name for group in KINDS[kind].head_keys for name in group.split("|")} | {"lm_head.weight"}
    return sorted({name.split(".")[0] + "." for name in names if not name.startswith("model.")})


def _write_head(head: dict[str, torch.Tensor], src: Path, dst: Path, safetensors: bool) -> None:
    """The value head in the weights' own format (vLLM reads safetensors files where a folder has any, else pickles),
    named in the safetensors index where the checkpoint has one."""
    from safetensors.torch import save_file

    head = {k: v.contiguous() for k, v in head.items()}
    if not safetensors:
        torch.save(head, dst / f"{HEAD_FILE}.bin")
        return
    save_file(head, str(dst / f"{HEAD_FILE}.safetensors"), metadata={"format": "pt"})
    if (src / SAFE_INDEX).is_file():
        index = json.loads((src / SAFE_INDEX).read_text())
        index["weight_map"] |= {k: f"{HEAD_FILE}.safetensors" for k in head}
        (dst / SAFE_INDEX).write_text(json.dumps(index, indent=2) + "\n")
