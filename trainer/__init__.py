"""The GRPO trainer (later issue)."""
