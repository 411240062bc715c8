"""rlprobe-patch: versioned, verified, revertible msprobe hooks for RL training stacks."""

__version__ = "0.1.0"
