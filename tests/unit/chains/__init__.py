"""Unit tests of orchestration.chains: the catalog and its checks."""
