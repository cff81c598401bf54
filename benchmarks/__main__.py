"""`python -m benchmarks --preset PRESET`: one preset's measurements, side by side in one run, written to
benchmarks/."""

from benchmarks.config import BenchConfig
from biprm.cli import run_program


def main(cfg: BenchConfig) -> None:
    """The preset's own module runs it: each measures what it names and writes its report."""
    if cfg.preset in ("serve", "vllm"):
        from importlib import import_module

        module = import_module(f"benchmarks.{cfg.preset}")
        module.write(module.run(cfg), cfg.out)
        return
    if cfg.preset == "search":
        from benchmarks.search import main as run
    elif cfg.preset == "long":
        from benchmarks.long import main as run
    else:
        from benchmarks.run import main as run
    run(cfg)


if __name__ == "__main__":
    run_program(BenchConfig, main, "python -m benchmarks")
