"""The controlled future-only-error test of the R2L stream and the gate, in three versions (README.md)."""
