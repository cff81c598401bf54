"""BiPRM rewards for RL trainers: a TRL GRPO reward function and per-token process rewards."""
