"""``python -m server`` is ``construct-mcp``."""

from __future__ import annotations

from server.cli.main import main

if __name__ == "__main__":
    main()
