"""A biprm checkpoint as vLLM loads it: the backbone's own flat config, naming our architecture.

vLLM sizes the KV cache and the layers from a flat config (hidden_size, num_hidden_layers,
...), while a biprm checkpoint nests them under `backbone_config`. The export writes the
backbone's config with `architectures = ["BiPRMForStepScoring"]`, the BiPRM settings under
`biprm`, and `io_processor_plugin = "biprm"` so `vllm serve` picks the IO processor itself.
Weights and tokenizer files are copied (or linked) as they are; the model maps `backbone.` to its body.

The config names the dtype `vllm serve` runs the body in. Under vLLM's `--dtype auto` a pooling
model whose config says float32 runs in float16 (`_get_and_verify_dtype`), which can overflow and
does not give biprm's scores, so the export names bfloat16 (or float16) and fp32 is asked for on
vLLM's command line. The heads run in fp32 whatever the body's dtype.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from biprm.checkpoint import check_checkpoint
from biprm.vllm_plugin import ARCHITECTURE, PLUGIN, SERVED_DTYPES


def export_for_vllm(checkpoint: str, out: str, link: bool = False, dtype: str = "bfloat16") -> Path:
    """The export folder, whose config asks vLLM for `dtype`; with `link` its files are symbolic links to the
    checkpoint's (a scratch export)."""
    from biprm.modeling import BiPRMConfig

    if dtype not in SERVED_DTYPES:
        raise ValueError(f"--dtype {dtype}: vLLM keeps only {' or '.join(SERVED_DTYPES)} from an export; for float32 pass --dtype float32 to vllm serve")
    check_checkpoint(checkpoint)
    src, dst = Path(checkpoint), Path(out)
    if dst.resolve() == src.resolve():
        raise ValueError(f"--out {out}: the export needs its own folder, not the checkpoint's")
    dst.mkdir(parents=True, exist_ok=True)
    config = BiPRMConfig.from_pretrained(src)
    flat = config.backbone_config.to_dict()
    flat.update(
        architectures=[ARCHITECTURE],
        dtype=dtype,
        io_processor_plugin=PLUGIN,
        biprm={"mode": config.mode, "step_tag_id": config.step_tag_id},
    )
    for f in src.iterdir():
        if not f.is_file() or f.name == "config.json":
            continue
        if link:
            (dst / f.name).symlink_to(f.resolve())
        else:
            shutil.copy2(f, dst / f.name)
    (dst / "config.json").write_text(json.dumps(flat, indent=2, default=str) + "\n")
    return dst
