"""The simulator lives in bench/ (bench/sim); put bench/ on the path for its tests."""
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
