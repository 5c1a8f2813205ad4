"""The framework profiles, one file per family of training stacks (planner/framework.py says what a profile states;
planner/frameworks.py holds them by name)."""
