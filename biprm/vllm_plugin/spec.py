"""An export's settings, as the plugin and `biprm serve --engine vllm` both read them.

`biprm.serve.export` writes them under `biprm` in the export's config.json; they are read here, apart from
vLLM and the server, so both read them one way."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from biprm.data.encoding import Encoder
from biprm.data.template import TEMPLATES


def spec_encoder(spec: dict, tokenizer: PreTrainedTokenizerBase, max_length: int) -> Encoder:
    """The encoder an export's settings name: the template and tag of its PRM kind (biprm's own in an export
    written before kinds were recorded)."""
    return Encoder(tokenizer, spec["step_tag_id"], max_length, TEMPLATES[spec.get("prm_kind", "biprm")])
