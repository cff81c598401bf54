"""The paper's l2r / r2l / bi-static / bi comparison at laptop scale, on SmolLM2-135M and real data (README.md)."""
