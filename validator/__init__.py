"""The validator: checks every rollout before it earns credit (later issue)."""
