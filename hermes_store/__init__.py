"""hermes-store: the Hermes agent's SQLite session store as a SQLAlchemy data layer."""

from __future__ import annotations

__version__ = "0.1.0"
