"""Side-by-side speed and memory benchmarks of biprm, kept beside the library with their results (docs/PERFORMANCE.md).

    python -m benchmarks --preset quick|full|smoke|serve|vllm|search|long   # the scorer, the servers, search, long
    traces
    python -m benchmarks.data                                               # the training data pipeline at
    Math-Shepherd size
    python benchmarks/prm_kinds.py                                          # a third-party PRM kind against biprm's own
    scorer

Each writes its Markdown and JSON here (benchmarks/); the library never imports this package.
"""
