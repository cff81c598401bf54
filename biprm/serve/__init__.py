"""`biprm serve`: a BiPRM behind HTTP with dynamic batching (needs the [serve] extra)."""
