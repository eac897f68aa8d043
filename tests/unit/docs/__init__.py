"""Tests of the documentation: every example of README.md and docs/**/*.md, the quick start CI runs, the
generated configuration reference."""
