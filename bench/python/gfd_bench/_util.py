"""What gfd's Python benchmarks share."""

from typing import List


def percentile(values: List[float], q: float) -> float:
    """Nearest rank, as gfd_benchmark computes it."""
    v = sorted(values)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def fmt_size(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}iB"
    return f"{n} B"


def write_csv(path: str, rows: List[dict]) -> None:
    """The rows as CSV, the first row's keys as the header (nothing where ``path`` is empty)."""
    if not path or not rows:
        return
    keys = list(rows[0].keys())
    with open(path, "w") as f:
        f.write(",".join(keys) + "\n")
        for r in rows:
            f.write(",".join(str(r[k]) for k in keys) + "\n")
