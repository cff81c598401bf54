"""PRM-guided search: partial solutions grown step by step and kept by their step scores."""
