"""Digests of whole preset runs, for "behaviour unchanged" checks of a refactor.

Each preset runs in this process (:func:`fedgraph.simulations.local.run_local`: the same strategy,
ClientApp handlers, ledger and report as ``fedgraph run``, clients one after another) with
``noise-source = "secret"`` and one fixed secret, so every noise draw is a function of the run
config, the secret and the client's data. The report, without its timings and host and worker
facts, is hashed (SHA-256 of its sorted JSON). Run it on two checkouts (e.g. two git worktrees,
from each one's root): equal digests mean equal reports.

Not a test (the large presets take minutes each).

Usage (from the checkout's root):
    python bench/report_digest.py [PRESET ...] [--data-root ../shared/data]
        [--secret S] [--out digests.json] [--dump-dir DIR]
        [--set KEY=VALUE ...] [--drop-config-fields F,G]

Without names, every preset in ``simulations/presets``.

Every noise key covers the run config (:func:`fedgraph.randomness.run_digest`), so a config
field added between the two checkouts changes every draw even at its default.
``--drop-config-fields`` (on the newer checkout) leaves such fields out of the noise keys and
the cleaned report, and ``--set`` (on both) pins a default that changed, so that the two
sides compare the code and not the config schema.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

VOLATILE = {
    "timings_s",
    "server_cpu_s",
    "exchange_s",
    "peak_rss_mib",
    "host",
    "workers",
    "traceback",
}


def clean_report(report: dict) -> dict:
    """The report without what differs between two runs of the same config on the same data
    (wall and CPU times, the host, the workers, the output folder)."""
    clean = {k: v for k, v in report.items() if k not in VOLATILE}
    clean["config"] = {k: v for k, v in clean["config"].items() if k != "output_dir"}
    return clean


def digest(report: dict) -> str:
    blob = json.dumps(clean_report(report), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("presets", nargs="*")
    parser.add_argument("--data-root", default=None, help="dataset root (default: $FEDGRAPH_DATA)")
    parser.add_argument("--secret", default="behaviour-check-secret-0123456789abcdef")
    parser.add_argument("--out", default=None, help="write {preset: {digest, test, s}} here")
    parser.add_argument("--dump-dir", default=None, help="write each cleaned report here")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run-config override for every preset (both checkouts)",
    )
    parser.add_argument(
        "--drop-config-fields",
        default="",
        help="comma-separated config fields (model names, e.g. round_strategy) "
        "added since the base: left out of noise keys and reports",
    )
    args = parser.parse_args(argv)
    dropped = {f for f in args.drop_config_fields.split(",") if f}
    os.environ["FEDGRAPH_NOISE_SECRET"] = args.secret
    if args.data_root:
        os.environ["FEDGRAPH_DATA"] = args.data_root
    sys.path.insert(0, os.getcwd())  # this checkout's packages first
    import torch

    torch.set_num_threads(1)
    from fedgraph.simulations.local import run_local
    from fedgraph.simulations.run_files import PRESETS, load_run_config

    if dropped:
        from fedgraph import randomness

        full_digest = randomness.run_digest

        class _Without:  # the config as the base checkout's schema had it
            def __init__(self, cfg):
                self.cfg = cfg

            def model_dump(self):
                return {k: v for k, v in self.cfg.model_dump().items() if k not in dropped}

        randomness.run_digest = lambda cfg: full_digest(_Without(cfg))

    names = args.presets or sorted(p.stem for p in PRESETS.glob("*.toml"))
    rows = {}
    for name in names:
        cfg = load_run_config(name, list(args.set))
        cfg.update({"noise-source": "secret", "output-dir": tempfile.mkdtemp(), "run-name": name})
        started = time.time()
        report = run_local(cfg)
        report["config"] = {k: v for k, v in report["config"].items() if k not in dropped}
        rows[name] = {
            "digest": digest(report),
            "test": report["accuracy"].get("test"),
            "s": round(time.time() - started, 1),
        }
        print(name, rows[name], flush=True)
        if args.dump_dir:
            Path(args.dump_dir).mkdir(parents=True, exist_ok=True)
            Path(args.dump_dir, f"{name}.json").write_text(
                json.dumps(clean_report(report), sort_keys=True, default=str, indent=1)
            )
        if args.out:
            tmp = Path(args.out).with_suffix(".tmp")
            tmp.write_text(json.dumps(rows, indent=1))
            tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
