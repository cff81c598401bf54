"""BiPRM rewards for RL trainers and search libraries: a TRL GRPO reward function, per-token process rewards, an its_hub PRM."""
