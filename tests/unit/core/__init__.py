"""Unit tests of orchestration.core: the pure records, facts, fold and decisions."""
