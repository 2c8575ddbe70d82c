"""What re-touching freed memory costs on this machine, after a pause: the time and system
time of filling a fresh ``--gib`` GiB tensor right after another of the same size was freed,
and after ``--pauses`` seconds of waiting.

Why: on a virtual machine whose balloon device reports free pages to the host
(``VIRTIO_BALLOON_F_REPORTING``, feature bit 5 of ``/sys/bus/virtio/drivers/virtio_balloon/*/features``;
Linux reports free blocks of ``2^page_reporting_order`` pages about two seconds after they are
freed), the host takes those pages back, and the guest's next touch of them faults in the host:
system time far above a plain first touch. A federated run frees and reallocates its
per-message tensors with pauses between one client's messages (the other clients' handlers
and the server run meanwhile), a plain loop reallocates at once; so the cost falls unevenly
(docs/results/performance.md, "What was tried"). The report records whether the balloon reports.

    python bench/refault.py                          # 2 GiB, pauses 0 and 5 s, 3 rounds
    python bench/refault.py --out bench/results/refault.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

import fedgraph.simulations  # noqa: F401  (THP_MEM_ALLOC_ENABLE before torch, as a run does)
from fedgraph.procstats import SYSFS


def free_page_reporting(sysfs: Path = SYSFS) -> bool | None:
    """Whether a virtio balloon here reports free pages to the host (``None``: no balloon);
    ``sysfs``: where Linux mounts sysfs (a test passes a folder laid out the same way)."""
    found = None
    for path in (sysfs / "bus/virtio/drivers/virtio_balloon").glob("*/features"):
        bits = path.read_text().strip()
        found = bool(found) or (len(bits) > 5 and bits[5] == "1")
    return found


def _sys() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def refill(elements: int, pause: float) -> tuple[float, float]:
    """Touch ``elements`` float32, free them, wait ``pause`` s, touch as many again:
    ``(wall s, system s)`` of the second touch."""
    x = torch.empty(elements)
    x.fill_(1.0)
    del x
    time.sleep(pause)
    s, t = _sys(), time.perf_counter()
    y = torch.empty(elements)
    y.fill_(1.0)
    wall = time.perf_counter() - t
    del y
    return wall, _sys() - s


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=2.0, help="size of each tensor, GiB (> 0)")
    p.add_argument("--pauses", default="0,5", help="comma-separated seconds (>= 0)")
    p.add_argument("--rounds", type=int, default=3, help="repeats per pause (>= 1)")
    p.add_argument("--out", type=Path, help="write the result as JSON (atomically)")
    a = p.parse_args(argv)
    try:
        pauses = [float(v) for v in a.pauses.split(",")]
    except ValueError:
        p.error(f"--pauses must be comma-separated seconds, got {a.pauses!r}")
    if not a.gib > 0 or a.rounds < 1 or any(not v >= 0 for v in pauses):
        p.error("--gib must be > 0, --rounds >= 1 and every pause >= 0")
    elements = int(a.gib * 2**28)
    rows = []
    for pause in pauses:
        runs = [refill(elements, pause) for _ in range(a.rounds)]
        walls, syss = [r[0] for r in runs], [r[1] for r in runs]
        rows.append(
            {
                "pause_s": pause,
                "wall_s": [round(w, 3) for w in walls],
                "sys_s": [round(s, 3) for s in syss],
                "wall_mean_s": round(statistics.mean(walls), 3),
            }
        )
        print(
            f"pause {pause:>4g} s: {a.gib:g} GiB re-touched in {statistics.mean(walls):.3f} s "
            f"(runs {', '.join(f'{w:.3f}' for w in walls)}; system "
            f"{', '.join(f'{s:.2f}' for s in syss)} s)"
        )
    res = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": sys.argv,
        "free_page_reporting": free_page_reporting(),
        "gib": a.gib,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }
    print(f"free page reporting to the host: {res['free_page_reporting']}")
    if a.out:
        tmp = a.out.with_suffix(a.out.suffix + ".tmp")
        tmp.write_text(json.dumps(res, indent=1) + "\n")
        tmp.replace(a.out)


if __name__ == "__main__":
    main()
