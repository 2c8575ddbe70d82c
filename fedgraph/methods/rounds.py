"""A client's own check of the training rounds a server's strategy sends it (any method whose
rounds are driven by a Flower strategy: GAP's encoder and classifier, ProGAP's stages)."""

from __future__ import annotations


def admit_round(phase: str, server_round: int, rounds: int, last: dict[str, int]) -> dict[str, int]:
    """Admit ``server_round`` of ``phase`` before the client trains: it must be within the
    ``1..rounds`` its privacy plan covers (node level each round is DP-SGD steps of its
    epsilon) and after the last round of ``phase`` it took part in (a round's draws are keyed
    by its number: a repeated round would repeat them). Whatever strategy drives the rounds
    (``round-strategy``, client sampling), a client releases at most what its plan accounted
    for.

    Args:
        phase: the rounds' name (e.g. ``gap.encoder``, ``progap.stage2``).
        server_round: the round the message says (Flower's ``server-round``).
        rounds: the rounds the plan covers.
        last: phase -> the last round this client trained (its state between messages).
    Returns:
        ``last`` with ``phase`` set to ``server_round``.
    Raises:
        ValueError: naming the phase, the round and the allowed range.
    """
    done = int(last.get(phase, 0))
    if not done < server_round <= rounds:
        raise ValueError(
            f"{phase}: train round {server_round} refused: allowed rounds "
            f"{done + 1}..{rounds} (the client's privacy plan covers {rounds} "
            f"rounds; it last trained in round {done})"
        )
    return {**last, phase: server_round}
