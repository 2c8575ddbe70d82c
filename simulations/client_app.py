"""The fedgraph ClientApp: every message type routed to its handler.

The handlers (:mod:`fedgraph.simulations.routes`, one module per method) decode the message, call one
function of the method's client half (:mod:`fedgraph.methods.gap.client`,
:mod:`fedgraph.methods.ppgnn.client`, :mod:`fedgraph.methods.privgnn.client`,
:mod:`fedgraph.methods.progap.client`) and encode the reply. The run config arrives inside
each message; every draw comes from the client's own generator
(:func:`fedgraph.randomness.client_generator`, keyed by the client's data too). The message
types and their records: :mod:`fedgraph.protocol` (``tests/test_protocol.py`` holds this file
and real runs to it).
"""

from __future__ import annotations

# First, before the heavy imports: under flwr run this is the task's own process, whose
# heartbeats a loaded machine must not lose (fedgraph.simulations.task_heartbeat).
from fedgraph.simulations import task_heartbeat

task_heartbeat.start()  # does nothing outside flwr run's task process

from flwr.clientapp import ClientApp

from fedgraph.simulations import wakeups
from fedgraph.simulations.handler_times import handler_times
from fedgraph.simulations.routes import common, gap, ppgnn, privgnn, progap

wakeups.install(if_imported=True)  # flwr run: patch Flower's message threads here (wakeups)
app = ClientApp(
    mods=[handler_times]
)  # off unless a benchmark asks (fedgraph.simulations.handler_times)

# PPGNN: the perturbed report, then the clients' counts of correct predictions
ppgnn_query = app.query("ppgnn")(ppgnn.ppgnn_query)
ppgnn_evaluate = app.evaluate("ppgnn")(ppgnn.ppgnn_evaluate)

# GAP: setup, keys, encoder rounds, PMA hops, classifier rounds, validation, final counts
gap_setup = app.query("gap_setup")(gap.gap_setup)
gap_keys = app.query("gap_keys")(common.advertise_key)
gap_train = app.train()(gap.gap_train)
gap_pma = app.query("gap_pma")(gap.gap_pma)
gap_evaluate_round = app.evaluate()(gap.gap_evaluate_round)
gap_evaluate = app.evaluate("gap")(gap.gap_evaluate)

# PrivGNN: keys, then rounds of answers to the server's queries
privgnn_keys = app.query("privgnn_keys")(common.advertise_key)
privgnn_query = app.query("privgnn")(privgnn.privgnn_query)

# ProGAP: setup, keys, then per stage its aggregation (release, finish) and its rounds
progap_setup = app.query("progap_setup")(progap.progap_setup)
progap_keys = app.query("progap_keys")(common.advertise_key)
progap_train = app.train("progap_stage")(progap.progap_train)
progap_validate = app.evaluate("progap_stage")(progap.progap_validate)
progap_eval = app.query("progap_eval")(progap.progap_eval)
progap_aggregate = app.query("progap_aggregate")(progap.progap_aggregate)
