"""Unit tests of server: tools, views, settings, transports and the CLI, in process."""
