"""BiPRM rewards for RL trainers and search libraries: TRL GRPO rewards, per-token process rewards, an its_hub PRM."""
