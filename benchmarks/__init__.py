"""Side-by-side speed and memory benchmarks of biprm, kept beside the library with their results (docs/PERFORMANCE.md).

    python -m benchmarks --preset quick|full|smoke|serve|vllm|search|long  # scorer, servers, search, long traces
    python -m benchmarks.data                                              # data pipeline at Math-Shepherd size
    python benchmarks/prm_kinds.py                                         # a third-party kind against biprm's scorer

Each writes its Markdown and JSON here (benchmarks/); the library never imports this package.
"""
