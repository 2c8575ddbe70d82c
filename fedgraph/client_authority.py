"""The client is the privacy authority: its own budget, its own ledger, its own refusals.

A client's guarantee must hold whatever the server sends (the threat model's server may deviate
from the protocol within the message schema: any request, in any order, any number of times,
with any weights, noise parameters, key lists or run config; issue 60). So the client does not
take its budget, its noise or its repeat behaviour from the server:

* **Its own budget.** :func:`check_asks_no_more`: the run config a request carries must be the
  client's own (a deployed client's node config; the simulation stands in for it with the run
  config the launcher gave the client: ``context.run_config`` under ``flwr run``, the
  environment under ``fedgraph run``: :func:`fedgraph.simulations.routes.common.own_config`) in
  every key that changes what is released, except that it may ask for *less* privacy loss: a
  smaller epsilon target, a smaller delta. Every noise parameter is then computed on the client
  from its own plan (a value sent by the server can only add noise).
* **Its own ledger.** :class:`ClientAuthority` charges every release before it leaves, with the
  same events the server's ledger records (each method's ``reply_events``, defined once beside
  its privacy argument), composes them with the run's accountant and refuses a release that
  would take a subject past the client's own budget (:data:`~fedgraph.accounting.ledger.
  BUDGET_RTOL` margin, as the server's check).
* **One release per purpose.** A release has a purpose (``gap:pma2``, ``progap:aggregation3``,
  a training round); a second request under a spent purpose gets back the release already made
  if the request is identical (a retry learns nothing new) and is refused otherwise (two
  releases of one purpose on inputs the server chose would give their noise-free difference).
* **Fresh noise for a different input.** :func:`transcript` chains every request the client
  received in the run; the key of every release binds it (:func:`fedgraph.randomness.derive_key`),
  so a release whose input differs (other rows received, other weights) never reuses noise.

Nothing here reads Flower: the ClientApp keeps the authority's state between messages
(:meth:`ClientAuthority.to_json`) and calls it from every release handler.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

from .accounting.events import EVENT_TYPES, Event, check_event
from .accounting.ledger import BUDGET_RTOL, PrivacyLedger

__all__ = [
    "ReleaseRefused",
    "ClientAuthority",
    "check_asks_no_more",
    "transcript",
    "GUARANTEE_KEYS_LOWER",
]


class ReleaseRefused(ValueError):
    """A client refuses a request: it would take a subject past the client's own budget, repeat
    a spent purpose with another input, or the run config asks for more privacy loss than the
    client's own. Nothing is released."""


#: run-config keys a request may set *below* the client's own value (less privacy loss):
#: per-client epsilon targets, the uniform epsilon, PPGNN's level budgets, delta
GUARANTEE_KEYS_LOWER = ("client_epsilons", "epsilon", "budgets", "delta")
#: run-config keys that never change what a client releases (:data:`fedgraph.randomness.
#: NOT_RELEASE_KEYS`)
_FREE_KEYS = frozenset({"device", "output_dir", "run_name", "timeout"})


def _lower_or_equal(name: str, asked, own, partition_id: int) -> bool:
    if asked == own:
        return True
    if asked is None or own is None:
        return False
    if name == "client_epsilons":  # only this client's own target counts

        def mine(v):
            return float(v[partition_id % len(v)])

        return mine(asked) <= mine(own)
    if isinstance(own, list):
        return (
            isinstance(asked, list)
            and len(asked) == len(own)
            and all(float(a) <= float(o) for a, o in zip(asked, own))
        )
    return float(asked) <= float(own)


def check_asks_no_more(asked, own, partition_id: int) -> None:
    """Refuse a request whose run config ``asked`` (a parsed config, e.g. a
    :class:`~fedgraph.config.GAPConfig`) differs from the client's own ``own`` in a key that
    changes what is released, other than asking for less privacy loss in
    :data:`GUARANTEE_KEYS_LOWER` (this client's epsilon target, delta, PPGNN's budgets: each at
    most the client's own) or filling in a key the client's own config leaves to the method
    (``None`` or ``""``; the client's ledger still charges what it then releases).

    Raises:
        ReleaseRefused: naming the first such key, the value asked and the client's own.
    """
    a, o = asked.model_dump(), own.model_dump()
    for name in sorted(set(a) | set(o)):
        if name in _FREE_KEYS:
            continue
        if name in GUARANTEE_KEYS_LOWER:
            if not _lower_or_equal(name, a.get(name), o.get(name), partition_id):
                raise ReleaseRefused(
                    f"{name.replace('_', '-')}: the request asks for {a.get(name)!r}, more "
                    f"privacy loss than this client's own {o.get(name)!r}; refusing to release"
                )
        elif a.get(name) != o.get(name) and o.get(name) not in (None, ""):
            # (a key the client's own config leaves to the method, None or "", the strategy
            # may fill in, e.g. PrivGNN's calibrated sigma-votes: what the client then releases
            # is charged to its own ledger, which refuses anything past its budget)
            raise ReleaseRefused(
                f"{name.replace('_', '-')}: the request's run config says {a.get(name)!r}, this "
                f"client's own says {o.get(name)!r}; refusing to release"
            )


def transcript(previous: str, message_type: str, request_digest: str) -> str:
    """The client's transcript after one more request: ``SHA-256(previous | message type |
    request digest)`` (hex). Chained over every request of the run, in order, it binds a
    release's noise key to everything the release can depend on that the client received."""
    return hashlib.sha256(f"{previous}|{message_type}|{request_digest}".encode()).hexdigest()


def _event_to_json(event: Event) -> dict:
    from dataclasses import asdict

    return {"type": type(event).__name__, **asdict(event)}


def _event_from_json(d: dict) -> Event:
    kinds = {t.__name__: t for t in EVENT_TYPES}
    d = dict(d)
    return kinds[d.pop("type")](**d)


@dataclass
class _Spent:
    request: str  # the request digest the purpose was spent on
    charges: list  # [(subject, release, event)]


@dataclass
class ClientAuthority:
    """A client's own budgets and ledger (module docs).

    Args:
        budgets: subject -> epsilon budget (nats; ``inf`` allowed), the client's own.
        delta: the delta at which non-pure events are composed (the client's own).
        accountant: the accountant name composing them (``prv``, ``pld``, ``rdp``).

    Example::

        authority = ClientAuthority({"client-0": 4.0}, delta=1e-7, accountant="prv")
        authority.admit("gap:pma1", digest)            # "new": nothing spent under it yet
        authority.charge("gap:pma1", digest, [("client-0", "pma", Gaussian(1.3))])
    """

    budgets: dict[str, float]
    delta: float
    accountant: str = "prv"
    spent: dict[str, _Spent] = field(default_factory=dict)
    #: events checked once to fit every budget (a plan): a ledger within them needs no new
    #: composition (the honest run's releases are exactly the plan's)
    allowance: dict[str, list] = field(default_factory=dict)

    def admit(self, purpose: str, request: str) -> str:
        """``"new"`` if nothing was released under ``purpose``, ``"repeat"`` if the same
        ``request`` (digest) was: answer it with the release already made.

        Raises:
            ReleaseRefused: ``purpose`` was spent on another request.
        """
        done = self.spent.get(purpose)
        if done is None:
            return "new"
        if done.request == request:
            return "repeat"
        raise ReleaseRefused(
            f"release {purpose!r} was already made on another request; a second release of "
            "one purpose on other inputs would give their noise-free difference: refusing"
        )

    def ledger(self) -> PrivacyLedger:
        """The client's ledger: every charged event, with the client's budgets."""
        led = PrivacyLedger()
        for s, b in self.budgets.items():
            led.set_budget(s, b)
        for done in self.spent.values():
            for subject, release, event in done.charges:
                led.record(subject, release, event)
        return led

    def epsilon(self, subject: str, ledger: PrivacyLedger | None = None) -> float:
        led = ledger or self.ledger()
        if subject not in led.subjects:
            return 0.0
        return float(led.epsilon(subject, self.delta, self.accountant)[0])

    def allow(self, subject: str, events: list) -> None:
        """Declare ``events`` (a plan: what the honest protocol spends for ``subject``) checked
        against the budget once: charges whose events stay within them compose nothing new.

        Raises:
            ReleaseRefused: the plan itself exceeds the subject's budget.
        """
        led = PrivacyLedger()
        for i, e in enumerate(events):
            led.record(subject, f"plan{i}", e)
        if events and self._over(subject, led):
            raise ReleaseRefused(
                f"{subject}: the plan's releases exceed this client's own "
                f"budget {self.budgets.get(subject)!r}; refusing to release"
            )
        self.allowance[subject] = list(events)

    def _over(self, subject: str, led: PrivacyLedger) -> bool:
        budget = self.budgets.get(subject)
        if budget is None:
            return True  # a subject without a budget of the client's own: nothing may leave
        if math.isinf(budget):
            return False
        eps = float(led.epsilon(subject, self.delta, self.accountant)[0])
        return not eps <= budget * (1 + BUDGET_RTOL)

    def _within_allowance(self, subject: str, events: list) -> bool:
        """Whether ``events`` are covered by the subject's allowance (same event types and
        parameters, no more applications): then they compose to at most the plan's epsilon."""
        left = {}
        for e in self.allowance.get(subject, []):
            key, n = _shape(e)
            left[key] = left.get(key, 0) + n
        for e in events:
            key, n = _shape(e)
            if left.get(key, 0) < n:
                return False
            left[key] -= n
        return True

    def charge(self, purpose: str, request: str, charges: list) -> None:
        """Record the release ``purpose`` on ``request`` with its ``charges`` (``[(subject,
        release, event)]``) before it leaves the client.

        Raises:
            ReleaseRefused: a subject would pass its budget (or has none of the client's
                own), or the purpose was spent on another request (:meth:`admit`).
        """
        if self.admit(purpose, request) == "repeat":
            return
        for _, _, e in charges:
            check_event(e)
        trial = dict(self.spent)
        trial[purpose] = _Spent(request, list(charges))
        for subject in {s for s, _, _ in charges}:
            events = [e for d in trial.values() for s, _, e in d.charges if s == subject]
            if self._within_allowance(subject, events):
                continue
            led = PrivacyLedger()
            for i, e in enumerate(events):
                led.record(subject, f"r{i}", e)
            if self._over(subject, led):
                raise ReleaseRefused(
                    f"release {purpose!r} would take {subject} past this client's own budget "
                    f"epsilon {self.budgets.get(subject)!r} (delta {self.delta:g}): refusing"
                )
        self.spent = trial

    def summary(self) -> dict[str, dict]:
        """subject -> ``{"epsilon", "budget", "releases"}``: the client's own figures, public
        (functions of its plan and of how many releases the server asked for), sent with its
        replies so that the report can put them beside the server's ledger."""
        led = self.ledger()
        return {
            s: {
                "epsilon": self.epsilon(s, led),
                "budget": self.budgets.get(s),
                "releases": sum(
                    1 for d in self.spent.values() if any(c[0] == s for c in d.charges)
                ),
            }
            for s in led.subjects
        }

    def to_json(self) -> str:
        return json.dumps(
            {
                "budgets": self.budgets,
                "delta": self.delta,
                "accountant": self.accountant,
                "spent": {
                    p: {
                        "request": d.request,
                        "charges": [[s, r, _event_to_json(e)] for s, r, e in d.charges],
                    }
                    for p, d in self.spent.items()
                },
                "allowance": {
                    s: [_event_to_json(e) for e in es] for s, es in self.allowance.items()
                },
            }
        )

    @classmethod
    def from_json(cls, text: str) -> ClientAuthority:
        d = json.loads(text)
        out = cls(
            {s: float(b) for s, b in d["budgets"].items()}, float(d["delta"]), d["accountant"]
        )
        out.spent = {
            p: _Spent(v["request"], [(s, r, _event_from_json(e)) for s, r, e in v["charges"]])
            for p, v in d["spent"].items()
        }
        out.allowance = {
            s: [_event_from_json(e) for e in es] for s, es in d.get("allowance", {}).items()
        }
        return out


def _shape(event: Event) -> tuple[tuple, int]:
    """``(kind and parameters, applications)`` of an event, for :meth:`ClientAuthority.
    _within_allowance`: applications of the same kind and parameters add up."""
    d = _event_to_json(event)
    n = int(d.pop("count", 0) or d.pop("steps", 0) or 1)
    d.pop("steps", None)
    d.pop("count", None)
    return tuple(sorted(d.items())), n
