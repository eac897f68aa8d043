"""Unit tests of orchestration.engine: the runtime, the drive and every prefix of a crashed run."""
