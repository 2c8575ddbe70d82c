"""The ClientApp's handlers, one module per method (``gap``, ``ppgnn``, ``privgnn``), and what
they share (``common``). Each handler decodes its message, calls one function of the method's
client half (``fedgraph.methods.<method>.client``: plain functions, no Flower, state in and
state out) and encodes the reply; Flower's objects (``Message``, ``Context``, records) stay
here. :mod:`fedgraph.simulations.client_app` registers them by message type."""
