"""Flower's simulation engine's own cost per message: a trivial ClientApp (a 10-float reply),
4 supernodes, one Ray actor, 50 rounds of 4 messages through the grid ``fedgraph run`` uses
(:class:`fedgraph.simulations.grid.InterruptibleGrid`, with :mod:`fedgraph.simulations.wakeups`).

The floor under any federated round of fedgraph's methods in a simulation (issue 16: what a
whole run through Flower and Ray pays per message beyond its handlers' work).

Usage: ``OMP_NUM_THREADS=1 python bench/flower_overhead.py [--rounds 50] [--clients 4]``;
prints one JSON line ``{"per_round_ms", "per_message_ms", "clients", "rounds"}``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedgraph.simulations import wakeups
from fedgraph.simulations.grid import InterruptibleGrid

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    return Message(
        RecordDict(
            {
                "arrays": ArrayRecord({"w": torch.zeros(10)}),
                "metrics": MetricRecord({"num-examples": 1}),
            }
        ),
        reply_to=msg,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--clients", type=int, default=4)
    args = p.parse_args()
    out: dict = {"clients": args.clients, "rounds": args.rounds}
    server = ServerApp()

    @server.main()
    def serve(grid: Grid, context: Context) -> None:
        grid = InterruptibleGrid(grid)
        nodes: list[int] = []
        while len(nodes) < args.clients:
            nodes = list(grid.get_node_ids())
            time.sleep(0.1)

        def one_round():  # the message a GAP round sends: small weights and the config
            return list(
                grid.send_and_receive(
                    [
                        Message(
                            RecordDict(
                                {
                                    "arrays": ArrayRecord({"w": torch.zeros(10)}),
                                    "config": ConfigRecord({"json": "x" * 1500}),
                                }
                            ),
                            dst_node_id=n,
                            message_type="train",
                        )
                        for n in nodes
                    ]
                )
            )

        one_round()  # the actor's start
        t = time.perf_counter()
        for _ in range(args.rounds):
            one_round()
        out["per_round_ms"] = round((time.perf_counter() - t) / args.rounds * 1e3, 2)
        out["per_message_ms"] = round(out["per_round_ms"] / args.clients, 2)

    wakeups.install()
    run_simulation(
        server_app=server,
        client_app=app,
        num_supernodes=args.clients,
        backend_config={
            "client_resources": {"num_cpus": 1},
            "init_args": {"num_cpus": 1, "include_dashboard": False},
        },
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
