"""Unit tests of orchestration.workers: the provider adapters, the retry policy and the fake provider."""
