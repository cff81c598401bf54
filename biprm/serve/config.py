"""Flags of `biprm serve`: a plain dataclass, so the CLI lists them without importing the server stack."""
from __future__ import annotations

from dataclasses import dataclass, field

from biprm.aggregate import AGGREGATIONS
from biprm.readers import SPLIT_RULES


@dataclass
class ServeConfig:
    model: str = field(metadata={"help": "checkpoint folder written by `biprm train`"})
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on (0.0.0.0 for every interface)"})
    port: int = field(default=8000, metadata={"help": "TCP port"})
    device: str | None = field(default=None, metadata={"help": "cuda, cuda:1, cpu (default: cuda if present)"})
    max_wait_ms: float = field(default=5.0, metadata={"help": "how long the first request of a batch waits for others to join"})
    max_batch_tokens: int = field(default=16384, metadata={"help": "stop gathering a batch at this many tokens (both streams)"})
    max_queue: int = field(default=1024, metadata={"help": "solutions waiting at most; past it requests get 503 at once"})
    max_length: int = field(default=4096, metadata={"help": "tokens per stream; trailing steps past it are not scored"})
    on_overlength: str = field(default="flag", metadata={"help": "flag: score the steps that fit and say so; refuse: answer 413"})
    aggregation: str = field(default="min", metadata={"help": f"solution score of /get_reward, one of {AGGREGATIONS}"})
    split: str = field(default="auto", metadata={"help": f"how free text is cut into steps, one of {SPLIT_RULES}"})

    def __post_init__(self) -> None:
        for name, value, allowed in (("aggregation", self.aggregation, AGGREGATIONS), ("split", self.split, SPLIT_RULES),
                                     ("on_overlength", self.on_overlength, ("flag", "refuse"))):
            if value not in allowed:
                raise ValueError(f"--{name.replace('_', '-')} {value!r}: choose one of {list(allowed)}")
