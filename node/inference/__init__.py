"""Inference backends: torch (default, CPU or GPU) and vLLM (the ``[vllm]`` extra, GPU nodes)."""
