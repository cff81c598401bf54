"""`biprm bench` and `biprm bench-data`: side-by-side speed and memory benchmarks (docs/PERFORMANCE.md; servers: docs/SERVING.md)."""
