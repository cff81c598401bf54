"""BiPRM inside vLLM: a pooling model for each stream's step tags, and an IO processor that fuses them.

The IO processor turns one scoring request into its stream prompts, and their pooled
outputs into one answer.

`biprm export --format vllm` writes a checkpoint vLLM can size and load; then
`vllm serve EXPORT` answers POST /pooling {"data": {"question": ..., "steps": [...]}}.
Nothing here imports vLLM until vLLM calls an entry point (pyproject: `vllm.general_plugins`
and `vllm.io_processor_plugins`), so biprm works without it.
"""

from __future__ import annotations

ARCHITECTURE = "BiPRMForStepScoring"
PLUGIN = "biprm"  # the IO processor's name, which the exported config asks for
SERVED_DTYPES = (
    "bfloat16",
    "float16",
)  # what vLLM's `--dtype auto` keeps from a pooling model's config (float32 becomes float16)


def register() -> None:
    """vLLM's general plugin hook, run in every vLLM process: make the architecture known."""
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "biprm.vllm_plugin.model:BiPRMForStepScoring")


def io_processor_plugin() -> str:
    """vLLM's IO-processor plugin hook: the class that speaks biprm's request and answer."""
    return "biprm.vllm_plugin.io_processor.BiPRMIOProcessor"
