"""The GRPO trainer: accepted rollouts in, policy steps out."""
