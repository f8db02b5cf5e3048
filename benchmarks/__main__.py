"""``python -m benchmarks``: every benchmark, side by side with torch (see benchmarks/run.py)."""

from __future__ import annotations

from benchmarks.run import main

raise SystemExit(main())
