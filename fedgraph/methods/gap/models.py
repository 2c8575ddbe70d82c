"""The encoder and classifier of a federated GAP run, built from its config (GAP paper Sec. 4,
:mod:`fedgraph.nn.gap`): the clients' models (:mod:`.client`) and the server's initial weights
(``strategies/gap.py``) come from the same two functions."""

from __future__ import annotations

from ...config import GAPConfig
from ...nn.gap import GAPClassifier, GAPEncoder


def build_encoder(cfg: GAPConfig, num_features: int, num_classes: int) -> GAPEncoder:
    """GAP's encoder; ``cfg.batch_norm``: the reference code's batch norms (hidden layers and
    after the normalized output), see :func:`build_classifier` for their statistics."""
    return GAPEncoder(
        num_features,
        num_classes,
        cfg.encoder_dim,
        cfg.hidden,
        2,
        0.0,
        batch_norm=cfg.batch_norm,
        output_batch_norm=cfg.batch_norm,
    )


def build_classifier(cfg: GAPConfig, num_features: int, num_classes: int) -> GAPClassifier:
    """GAP's classifier; ``cfg.batch_norm`` (edge level only): the reference code's batch norms
    (hidden layers and after the normalized combined hops). Federated, a client's batch norm
    normalizes with its own training nodes' statistics while training (local statistics,
    as FedAvg with batch norm does); the running statistics are averaged by the server weighted
    by training nodes with the weights, and evaluation uses them. With one client this is the
    centralized model; with several, the training statistics are the clients', so FedSGD no
    longer follows the one-client trajectory exactly (``tests/test_gap_equivalence.py``).
    Privacy: the statistics are functions of features and labels and of PMA's noisy rows, the
    same inputs as the weights (edge level): no further epsilon."""
    hops = 0 if cfg.variant == "mlp" else cfg.hops
    in_dim = num_features if cfg.variant == "mlp" else cfg.encoder_dim
    return GAPClassifier(
        hops,
        in_dim,
        cfg.hidden,
        num_classes,
        cfg.combine,
        base_layers=2 if cfg.variant == "mlp" else 1,
        head_layers=1,
        dropout=0.0,
        batch_norm=cfg.batch_norm,
        output_batch_norm=cfg.batch_norm,
    )
