"""Metrics as pure functions of flat arrays: Best-of-N, ProcessBench, PRMBench, intervals, ranking."""
