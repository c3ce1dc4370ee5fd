"""The hostile-input suite's own helpers (hostile_text_kit) on the import path, beside tests/ (pytest's pythonpath)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
