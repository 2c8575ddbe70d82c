"""The privacy auditor on the real client code (issue 63): canaries planted in a client's data,
the client's real release handler run on both neighbouring inputs many times with fresh
noise, and the statistics of :mod:`fedgraph.auditing` turning the best threshold test's errors
into a lower bound on epsilon, beside the epsilon the client's ledger charges for that release.

What a trial is. Every trial is one call of the ClientApp (:data:`fedgraph.simulations.
client_app.app`, the function Flower calls) on a fresh client (a new ``Context``: its own run
config, an empty state, so a fresh ledger and a fresh run key from the OS:
``noise-source = "secure"`` unless the run config says otherwise), with the request the server
would send. The client reads its view through :func:`fedgraph.federation.client_view`; the
auditor hands it a planted copy (:func:`planted_views`), nothing else is replaced: the
mechanism, its sigma, the generator and the ledger are the ones under test.

Many canaries per release. A client's release holds many rows (GAP/ProGAP: one per remote
node; PPGNN: one report per user), each a function of its own part of the data with its own
noise. Canary ``j`` (an edge ``u_j -> v_j`` into a remote node ``v_j`` that no other edge of
the client reaches; a user ``j``) is present with probability 1/2, independently; row ``j``'s
distribution depends on canary ``j`` alone, so the rows of one release are independent trials
of the one-canary audit (the other canaries are part of the fixed rest of the data for that
row). The vectorized batch is therefore the client's real release itself.

Releases audited (the first release of each, whose input does not depend on the edges):

``gap`` (edge level)
    PMA hop 1 (``query.gap_pma``): client ``a``'s released row of ``v_j`` projected on
    ``h_u``, the canary's hop-0 row (unit norm: the sensitivity 1 of one directed edge);
    undirected edges (``edge-unit = "undirected"``): plus the partner client ``b``'s released
    row of ``u_j`` on ``h_v`` (the other half), the two rows a server sees of one undirected
    edge. Ledger: the client's events of one hop (``reply_events(plan, "pma")``).
``progap`` (edge level)
    stage 1's aggregation (``query.progap_aggregate``, step ``release``), the same way.
``ppgnn``
    each user's report (``query.ppgnn``) with the user's features at the two opposite corners
    of the public domain; the score is the sum of the server's own estimate of the user's
    features (the mechanism's ``estimate``), i.e. the report projected on the corners'
    difference. One subject per privacy level (the level each user drew on the client).
    Ledger: the subject's events (``reply_events(cfg, mech)``).

Not audited here yet (the report says so): node level (DP-SGD), PrivGNN, PPGNN's level
subject, labels under ``label-epsilon``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch

from fedgraph.auditing import AuditResult, epsilon_lower_bound

#: trials a side per subject by default (``fedgraph audit --trials``)
DEFAULT_TRIALS = 20000
#: the largest number of canaries planted in one release
MAX_CANARIES = 512


@dataclass
class SubjectAudit:
    """One privacy subject's audit: ``epsilon`` the ledger's epsilon of the audited release
    at the run's delta, ``result`` the bound (:class:`fedgraph.auditing.AuditResult`),
    ``canary`` and ``test`` in words, ``release`` the ledger's name of what was audited,
    ``releases`` how many client releases the trials took, ``seconds`` their time."""

    subject: str
    epsilon: float
    result: AuditResult
    canary: str
    test: str
    release: str
    releases: int
    seconds: float

    @property
    def above(self) -> bool:
        """The bound exceeds the ledger's epsilon: the release spends more than it reports."""
        return self.result.epsilon_lower_bound > self.epsilon

    def to_dict(self) -> dict:
        r = self.result
        return {
            "epsilon": self.epsilon,
            "epsilon_lower_bound": r.epsilon_lower_bound,
            "confidence": r.confidence,
            "trials": min(r.trials),
            "canary": self.canary,
            "test": self.test,
            "release": self.release,
            "releases": self.releases,
            "seconds": round(self.seconds, 3),
            "above": self.above,
            "statistics": r.to_dict(),
        }


@contextmanager
def planted_views(views: dict):
    """The clients' handlers read ``views[partition id]`` (a
    :class:`fedgraph.federation.ClientView`) instead of their cached view while inside; the
    others read theirs."""
    from fedgraph.simulations.routes import common

    real = common.client_view

    def client_view(cfg, partition_id, *args, **kwargs):
        if partition_id in views:
            return views[partition_id]
        return real(cfg, partition_id, *args, **kwargs)

    common.client_view = client_view
    try:
        yield
    finally:
        common.client_view = real


class _Clients:
    """Fresh clients of one run: each :meth:`call` is one request to a new ``Context`` (its own
    run config ``config``, empty state), answered by the real ClientApp."""

    def __init__(self, config: dict, num_clients: int):
        from fedgraph.simulations.local import LocalGrid

        LocalGrid(num_clients)  # the server's task identity and the clients' identity keys
        from fedgraph.simulations.client_app import app

        self.app, self.config, self.n, self.runs = app, dict(config), num_clients, 0

    def context(self, pid: int):
        import os

        from flwr.app import Context, RecordDict

        from fedgraph.randomness import SECRET_NODE_KEY

        self.runs += 1
        # noise-source "secret": a fresh secret per client (the trials' noise independent)
        return Context(
            run_id=self.runs,
            node_id=pid + 1,
            state=RecordDict(),
            run_config=dict(self.config),
            node_config={
                "partition-id": pid,
                "num-partitions": self.n,
                SECRET_NODE_KEY: os.urandom(32).hex(),
            },
        )

    def call(self, pid: int, message_type: str, records: dict, context=None):
        """``(reply, context)``; the handler's exception is raised."""
        from flwr.app import Message, RecordDict

        ctx = context if context is not None else self.context(pid)
        msg = Message(content=RecordDict(records), dst_node_id=pid + 1, message_type=message_type)
        reply = self.app(msg, ctx)
        if reply.has_error():
            raise RuntimeError(f"client {pid} refused {message_type}: {reply.error.reason}")
        return reply, ctx


def _payload(cfg):
    from flwr.app import ConfigRecord

    return ConfigRecord({"json": json.dumps(cfg.model_dump())})


def _epsilon(events, delta: float, accountant: str) -> float:
    from fedgraph.accounting import compose_epsilon

    return float(compose_epsilon(list(events), delta, accountant)) if events else 0.0


# ========================================================================= edge canaries
@dataclass
class EdgeRelease:
    """How one method's edge-level release is requested and read: ``message_type``;
    ``records(cfg, pid, view)`` the request's records; ``rows(view, records)`` the hop-0
    rows ``[n, e]`` the release sums (unit norm), computed by the client's own function;
    ``events(cfg, pid, view)`` the ledger events of one release; ``in_graph(cfg, view)`` the
    local nodes that may carry a canary (bool ``[n]``) and the remote ones (bool ``[N]``);
    ``release`` the ledger's name."""

    message_type: str
    records: Callable
    rows: Callable
    events: Callable
    in_graph: Callable
    release: str


def _gap_release() -> EdgeRelease:
    from flwr.app import ArrayRecord, ConfigRecord

    from fedgraph.methods.gap import client as gap

    def graph(cfg):
        return "train" if cfg.inference == "inductive" and cfg.variant != "mlp" else "all"

    def records(cfg, pid, view):
        torch.manual_seed(cfg.seed)  # the server's fresh encoder (untrained: any weights do)
        model, _ = gap.inputs(cfg, view, "gap.encoder", None)
        empty = {"ids": torch.zeros(0, dtype=torch.long), "sums": torch.zeros(0, cfg.encoder_dim)}
        return {
            "config": _payload(cfg),
            "pma": ConfigRecord({"hop": 1, "graph": graph(cfg), "object-store": False}),
            "incoming": ArrayRecord(empty),
            "encoder": ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()}),
        }

    def rows(view, recs):
        cfg = _cfg_of(recs)
        model, x = gap.inputs(cfg, view, "gap.encoder", recs["encoder"].to_torch_state_dict())
        with torch.no_grad():
            return model.embed(x).float().cpu()

    def events(cfg, pid, view):
        from fedgraph.methods.gap.privacy import reply_events

        return [e for _, e in reply_events(gap.client_plan(cfg, pid, view).to_dict(), "pma")]

    def in_graph(cfg, view):
        from fedgraph.methods.gap.client_pma import graph_nodes

        mask = graph_nodes(view.test_mask, graph(cfg))
        if mask is None:
            mask = torch.ones(view.schema["num_nodes"], dtype=torch.bool)
        return mask[view.graph.node_ids], mask

    return EdgeRelease("query.gap_pma", records, rows, events, in_graph, "pma (hop 1)")


def _progap_release() -> EdgeRelease:
    from flwr.app import ArrayRecord, ConfigRecord

    from fedgraph.methods.progap import client as progap

    def records(cfg, pid, view):
        torch.manual_seed(cfg.seed)
        s = view.schema
        model = progap.build_model(cfg, s["num_features"], s["num_classes"])
        return {
            "config": _payload(cfg),
            "agg": ConfigRecord({"stage": 1, "step": "release", "object-store": False}),
            "arrays": ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()}),
        }

    def rows(view, recs):
        from fedgraph.nn.gap import normalize_rows

        cfg = _cfg_of(recs)
        model, x = progap.stage_model(cfg, view, 0, recs["arrays"].to_torch_state_dict(), [])
        with torch.no_grad():
            return normalize_rows(model.embed(x)).float().cpu()

    def events(cfg, pid, view):
        from fedgraph.methods.progap.privacy import reply_events

        plan = progap.client_plan(cfg, pid, view).to_dict()
        return [e for _, e in reply_events(plan, "aggregation")]

    def in_graph(cfg, view):
        return (
            torch.ones(view.graph.num_nodes, dtype=torch.bool),
            torch.ones(view.schema["num_nodes"], dtype=torch.bool),
        )

    return EdgeRelease(
        "query.progap_aggregate", records, rows, events, in_graph, "aggregation (stage 1)"
    )


def _cfg_of(recs):
    from fedgraph.simulations.client_guard import _parsed

    return _parsed(str(recs["config"]["json"]))


def _with_boundary(view, boundary: torch.Tensor):
    """``view`` with its client's boundary edges replaced (sorted by target, as loaded)."""
    order = torch.argsort(boundary[1], stable=True)
    return replace(view, graph=replace(view.graph, boundary_edge_index=boundary[:, order]))


def _released_rows(reply, ids: torch.Tensor) -> torch.Tensor:
    """The rows of the release ``partial_sums`` for the global ``ids``."""
    from fedgraph.messaging import bulk_tensors

    rel = bulk_tensors(reply.content["partial_sums"])
    if "sums" not in rel:
        raise ValueError(
            "the release is masked (secure aggregation): the auditor reads "
            "unmasked rows; run it with secure-aggregation = false"
        )
    pos = torch.searchsorted(rel["ids"], ids)
    if bool((rel["ids"][pos.clamp_max(rel["ids"].numel() - 1)] != ids).any()):
        raise ValueError("the release lacks a canary's row")
    return rel["sums"][pos].float()


def audit_edges(
    cfg,
    config: dict,
    spec: EdgeRelease,
    a: int,
    trials: int,
    *,
    rng,
    confidence: float = 0.95,
    repeats: int = 2,
) -> SubjectAudit:
    """Client ``a``'s release ``spec`` audited with cross-client canary edges (module
    docstring): ``trials`` a side. ``repeats``: the auditor, as a deviating server, sends each
    client the request that many times (each time another request under the same purpose,
    :func:`_nonce`) and sums what it gets: a client must refuse all but the first."""
    from fedgraph.federation import client_view

    started = time.perf_counter()
    clients = _Clients(config, cfg.num_clients)
    va = client_view(cfg, a)
    events_a = spec.events(cfg, a, va)
    sigma_of = {}
    for c in range(cfg.num_clients):
        plan = _plan_sigma(cfg, c, client_view(cfg, c))
        sigma_of[c] = plan
    undirected = getattr(cfg, "edge_unit", "undirected") == "undirected"
    same = [c for c in range(cfg.num_clients) if c != a and sigma_of[c] == sigma_of[a]]
    b = same[0] if same else (a + 1) % cfg.num_clients
    both = undirected and bool(same)
    vb = client_view(cfg, b)
    rec_a, rec_b = spec.records(cfg, a, va), spec.records(cfg, b, vb)
    h_a, h_b = spec.rows(va, rec_a), spec.rows(vb, rec_b)
    local_a, _ = spec.in_graph(cfg, va)
    local_b, _ = spec.in_graph(cfg, vb)
    cand_u = (local_a & (h_a.norm(dim=1) > 0.5)).nonzero().flatten()
    cand_v = (local_b & (h_b.norm(dim=1) > 0.5)).nonzero().flatten()
    per = min(cand_u.numel(), cand_v.numel(), MAX_CANARIES)
    if per < 1:
        raise ValueError(f"clients {a} and {b} have no nodes to plant a canary edge between")
    from fedgraph.client_authority import ReleaseRefused

    scores, labels, releases, counts = [], [], 0, np.zeros(2, dtype=int)
    refused = answered = 0
    while counts.min() < trials:
        releases += 1
        u = cand_u[torch.from_numpy(rng.permutation(cand_u.numel())[:per])]
        v = cand_v[torch.from_numpy(rng.permutation(cand_v.numel())[:per])]
        present = torch.from_numpy(rng.random(per) < 0.5)
        gu, gv = va.graph.node_ids[u], vb.graph.node_ids[v]
        ea = va.graph.boundary_edge_index
        ea = ea[:, ~torch.isin(ea[1], gv)]  # no other edge of a reaches a canary's target
        ea = torch.cat([ea, torch.stack([u[present], gv[present]])], 1)
        planted = {a: _with_boundary(va, ea)}
        if both:
            eb = vb.graph.boundary_edge_index
            eb = eb[:, ~torch.isin(eb[1], gu)]
            eb = torch.cat([eb, torch.stack([v[present], gu[present]])], 1)
            planted[b] = _with_boundary(vb, eb)
        with planted_views(planted):
            s = torch.zeros(per)
            for pid, recs, ids, h in ((a, rec_a, gv, h_a[u]), (b, rec_b, gu, h_b[v]))[: 1 + both]:
                ctx = None
                for r in range(repeats):  # the server asks again (another request, one purpose)
                    try:
                        reply, ctx = clients.call(
                            pid, spec.message_type, _nonce(recs, r) if r else recs, ctx
                        )
                    except ReleaseRefused:
                        refused += 1
                        break
                    answered += r > 0
                    s += (_released_rows(reply, ids) * h).sum(1)
        scores.append(s.double().numpy())
        labels.append(present.numpy())
        counts += (int((~present).sum()), int(present.sum()))
    s, lab = np.concatenate(scores), np.concatenate(labels)
    result = epsilon_lower_bound(s[~lab], s[lab], cfg.delta, confidence=confidence, rng=rng)
    if both:
        halves = f"both halves (rows of clients {a} and {b})"
    else:
        halves = f"the half into client {b}" + (
            " (no client with the same sigma: looser by sqrt 2)" if undirected else ""
        )
    asked = (
        f"; request repeated x{repeats}: {answered} repeats answered, {refused} refused"
        if repeats > 1
        else ""
    )
    canary = (
        f"cross-client edge u -> v, client {a} -> {b}, {per} per release, each present "
        f"w.p. 1/2; {halves}{asked}"
    )
    test = (
        "best threshold on <released row of v, h_u>"
        + (" + <row of u, h_v>" if both else "")
        + "; Clopper-Pearson, threshold held out"
    )
    return SubjectAudit(
        f"client-{a}",
        _epsilon(events_a, cfg.delta, cfg.accountant),
        result,
        canary,
        test,
        spec.release,
        releases,
        time.perf_counter() - started,
    )


def _nonce(records: dict, r: int) -> dict:
    """``records`` with a field the handler ignores set to ``r`` in the request's
    parameters (``pma``/``agg``): another request (another digest) for the same release."""
    from flwr.app import ConfigRecord

    out = dict(records)
    key = "pma" if "pma" in out else "agg"
    out[key] = ConfigRecord({**dict(records[key]), "audit-repeat": r})
    return out


def _plan_sigma(cfg, pid, view) -> float:
    if cfg.method == "gap":
        from fedgraph.methods.gap.client import client_plan
    else:
        from fedgraph.methods.progap.client import client_plan
    return round(float(client_plan(cfg, pid, view).sigma), 12)


# ========================================================================= PPGNN users
def estimate_score(mech, report: dict, num_features: int) -> np.ndarray:
    """The default PPGNN distinguisher: per user, the sum of the server's own estimate of
    its features (``mech.estimate``), i.e. the report projected on the corners' difference."""
    est, _ = mech.estimate(report, num_features)
    return est.double().sum(1).numpy()


def audit_ppgnn(
    cfg,
    config: dict,
    trials: int,
    *,
    rng,
    confidence: float = 0.95,
    clients_used: int | None = None,
    score=None,
) -> dict[str, SubjectAudit]:
    """Every level's users audited with their features at the domain's two corners (module
    docstring): ``trials`` a side per subject. ``score(mech, report, num_features)``: the
    distinguisher, per user ``[n]`` from the mechanism's report (higher: the upper corner);
    default :func:`estimate_score`. A mechanism-specific attack (a floating-point one, say)
    is passed here."""
    score = score or estimate_score
    from fedgraph.federation import client_view
    from fedgraph.methods.ppgnn.client import with_client_levels
    from fedgraph.methods.ppgnn.privacy import build_mechanism, reply_events
    from fedgraph.randomness import client_generator

    started = time.perf_counter()
    clients = _Clients(config, cfg.num_clients)
    mech = build_mechanism(cfg)
    subjects: dict[str, list] = {}
    for subject, _, event in reply_events(cfg, mech):
        subjects.setdefault(subject, []).append(event)
    uniform = list(subjects) == ["every-user"]
    scores = {s: [] for s in subjects}
    labels = {s: [] for s in subjects}
    order = list(range(clients_used or cfg.num_clients))
    releases = 0

    def enough():
        return all(
            min(
                int(np.sum(np.concatenate(labels[s]))) if labels[s] else 0,
                int(np.sum(~np.concatenate(labels[s]))) if labels[s] else 0,
            )
            >= trials
            for s in subjects
        )

    while not enough():
        pid = order[releases % len(order)]
        releases += 1
        view = client_view(cfg, pid)
        g = view.graph
        lo, hi = view.feature_domain
        present = torch.from_numpy(rng.random(g.num_nodes) < 0.5)
        x = torch.where(present.view(-1, 1), torch.full_like(g.x, hi), torch.full_like(g.x, lo))
        planted = replace(view, graph=replace(g, x=x))
        with planted_views({pid: planted}):
            reply, ctx = clients.call(pid, "query.ppgnn", {"config": _payload(cfg)})
        report = {k: v for k, v in reply.content["report"].to_torch_state_dict().items()}
        mech_report = {k[5:]: v for k, v in report.items() if k.startswith("mech.")}
        s = np.asarray(score(mech, mech_report, g.x.size(1)), dtype=float)
        if uniform:
            scores["every-user"].append(s)
            labels["every-user"].append(present.numpy())
            continue
        # the levels this client drew for its users (the same generator: a run-fixed purpose)
        levels = with_client_levels(
            planted.graph,
            cfg,
            client_generator(cfg, ctx, pid, "ppgnn:levels", data=planted.graph, inputs=""),
        ).levels
        for t in range(1, len(cfg.budgets) + 1):
            at = (levels == t).numpy()
            scores[f"level-{t}"].append(s[at])
            labels[f"level-{t}"].append(present.numpy()[at])
    out = {}
    took = time.perf_counter() - started
    for subject, events in subjects.items():
        sc, lab = np.concatenate(scores[subject]), np.concatenate(labels[subject])
        result = epsilon_lower_bound(sc[~lab], sc[lab], cfg.delta, confidence=confidence, rng=rng)
        out[subject] = SubjectAudit(
            subject,
            _epsilon(events, cfg.delta, "prv"),
            result,
            f"a user's features at the domain's opposite corners ({lo:g} vs {hi:g} in every "
            "dimension), every user of a release a canary w.p. 1/2",
            (
                "best threshold on the sum of the server's estimate of the user's features"
                if score is estimate_score
                else f"best threshold on {_name(score)}"
            )
            + f" (mechanism {cfg.mechanism!r}); Clopper-Pearson, threshold held out",
            "report (features)",
            releases,
            took,
        )
    return out


def _name(fn) -> str:
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    return doc[0].rstrip(".") if doc else getattr(fn, "__name__", "a user's score")


# ========================================================================= the run
#: what the auditor does not audit yet, per method and level (the report says so)
NOT_AUDITED = {
    ("gap", "node"): "node level (DP-SGD and degree-bounded PMA): not audited yet",
    ("progap", "node"): "node level (DP-SGD): not audited yet",
    ("privgnn", None): "PrivGNN's answers: not audited yet",
}


def audit_run(
    config: dict,
    trials: int = DEFAULT_TRIALS,
    *,
    confidence: float = 0.95,
    subjects: list[str] | None = None,
    seed: int | None = None,
    repeats: int = 2,
    score=None,
) -> dict:
    """Audit a run config (flat keys, as ``fedgraph run`` takes it): ``{"subjects": {name:
    SubjectAudit.to_dict()}, "not_audited": [...], "method", "delta", "trials", "confidence",
    "seconds"}``. ``subjects``: only these (e.g. ``["client-0"]``); ``seed``: the trials'
    canary choices (the noise is the clients' own, fresh from the OS under
    ``noise-source = "secure"``); ``repeats``: GAP and ProGAP, how many times each request is
    sent (:func:`audit_edges`); ``score``: PPGNN's distinguisher (:func:`audit_ppgnn`).

    Raises:
        fedgraph.config.ConfigError: an invalid config.
    """
    from fedgraph.federation import preflight
    from fedgraph.simulations.server_app import validate_run_config

    started = time.perf_counter()
    # the auditor reads the rows themselves: unmasked, the strongest view of a server (masks
    # only hide more); GAP's and ProGAP's edge-level sigma does not depend on it
    config = {**config, "secure-aggregation": False}
    _, cfg = validate_run_config(config)
    preflight(cfg)
    rng = np.random.default_rng(seed)
    audits, skipped = {}, []
    level = getattr(cfg, "level", None)
    if cfg.method in ("gap", "progap") and level == "edge":
        spec = _gap_release() if cfg.method == "gap" else _progap_release()
        for a in range(cfg.num_clients):
            name = f"client-{a}"
            if subjects is None or name in subjects:
                audits[name] = audit_edges(
                    cfg, config, spec, a, trials, rng=rng, confidence=confidence, repeats=repeats
                )
    elif cfg.method == "ppgnn":
        audits = {
            k: v
            for k, v in audit_ppgnn(
                cfg, config, trials, rng=rng, confidence=confidence, score=score
            ).items()
            if subjects is None or k in subjects
        }
    else:
        skipped.append(
            NOT_AUDITED.get(
                (cfg.method, level),
                NOT_AUDITED.get((cfg.method, None), f"{cfg.method}: not audited yet"),
            )
        )
    return {
        "method": cfg.method,
        "delta": cfg.delta,
        "trials": trials,
        "confidence": confidence,
        "subjects": {k: v.to_dict() for k, v in audits.items()},
        "not_audited": skipped,
        "seconds": round(time.perf_counter() - started, 3),
        "above": [k for k, v in audits.items() if v.above],
    }


def write_audit(out: dict, config: dict, preset: str | None = None):
    """Write ``out`` (:func:`audit_run`) atomically to ``<output-dir>/<run-name>.audit.json``
    (no ``run-name``: ``<preset or method>-<dataset>-audit``); returns the path."""
    from pathlib import Path

    from fedgraph.report import write_json_atomic
    from fedgraph.simulations.server_app import validate_run_config

    _, cfg = validate_run_config(config)
    stem = Path(str(preset)).stem if preset else cfg.method
    name = getattr(cfg, "run_name", "") or f"{stem}-audit"
    folder = Path(getattr(cfg, "output_dir", "") or "outputs").expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(folder / f"{name}.audit.json", out)
