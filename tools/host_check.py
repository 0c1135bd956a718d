"""How fast a lease's host made driver calls, from gfd_benchmark CSVs: the median submit time of
the one contiguous cudaMemcpyAsync (method dma_contiguous, idle rows), which no gfd code touches.
Usual H200 hosts: 1.9-5.6 us (every lease with such rows in bench/results/ from the twelfth to
the sixteenth session). Two leases were at 9.5-10.2 us (the thirteenth session's call 4 and the
seventeenth's call 2), and gfd moved 4 KB swap-ins there at 32-61% instead of 61-67%
(bench/history/2026-12-03-s17-flag-stream.md): past SLOW_US the line says so.
Not read: rows measured without a GPU (mode host-only, the emulated device), and copies larger
than MAX_BYTES (rows without transfer_bytes are read), whose submit grows with the size (medians
over bench/results/: 2.6 us at 16 MiB, 6.4 us at 256 MiB, 23 us at 1 GiB): a lease that ran only
1 GiB copies read "slow" on a usual host (bench/history/2026-12-04-s18-final-runs.md).
    python3 tools/host_check.py [--strict] file.csv [file.csv ...]
--strict: exit status 3 when the host is slow (gpu_paged.sh's HOST_STRICT=1 stops there)."""
import csv
import statistics
import sys

SLOW_US = 7.5
MAX_BYTES = 256 << 20


def main(args):
    strict = "--strict" in args
    paths = [a for a in args if a != "--strict"]
    subs = []
    for path in paths:
        try:
            with open(path, newline="") as f:
                for row in csv.DictReader(f):
                    if row.get("method") == "dma_contiguous" and row.get("load") == "none":
                        try:
                            if row.get("mode", "gpu") != "gpu" or int(row.get("transfer_bytes") or 0) > MAX_BYTES:
                                continue
                            subs.append(float(row["submit_p50_us"]))
                        except (KeyError, ValueError):
                            pass
        except OSError as e:
            print(f"host_check: {path}: {e}", file=sys.stderr)
    if not subs:
        print(f"no idle dma_contiguous rows of at most {MAX_BYTES >> 20} MiB on a GPU (no gfd_benchmark step "
              "ran, or only larger copies, or no GPU): host speed not known")
        return 0
    med = statistics.median(subs)
    verdict = (f"SLOW (over {SLOW_US:g} us): driver calls are slow on this host, gfd's rates are low"
               if med > SLOW_US else "as usual")
    print(f"a contiguous cudaMemcpyAsync submits in {med:.1f} us (median of {len(subs)} idle rows; "
          f"usual 2-6 us): {verdict}")
    return 3 if strict and med > SLOW_US else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
