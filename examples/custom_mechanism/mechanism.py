"""A custom LDP feature mechanism for PPGNN: the Piecewise Mechanism on one sampled dimension.

Wang et al., "Collecting and Analyzing Multidimensional Data with Local Differential Privacy",
ICDE 2019, Alg. 2 (PM) with k = 1 sampled dimension (Alg. 4). Every user samples one of the d
dimensions uniformly and releases its value through PM with the whole budget epsilon:
with C = (e^(eps/2) + 1) / (e^(eps/2) - 1), l(v) = (C + 1)/2 v - (C - 1)/2, r(v) = l(v) + C - 1,
the output is uniform on [l, r] with probability e^(eps/2) / (e^(eps/2) + 1), else uniform on
[-C, l) U (r, C]. E[output] = v, so d * output at the sampled dimension is unbiased for x.
One release of an eps-LDP mechanism per user: privacy_spent = {"piecewise": eps}.

Uniform setting (like the LPGNN baseline): every user gets ``epsilon`` (default: the smallest
budget), so the server needs no level.

Run: fedgraph run examples/custom_mechanism/run.toml
"""

import math

import torch

from fedgraph import randomness as rng
from fedgraph.mechanisms import FeatureMechanism, register_mechanism


class PiecewiseMechanism(FeatureMechanism):
    name = "piecewise"

    def __init__(self, budgets, epsilon=None, **_):  # the factory gets every mechanism option
        self.epsilon = float(epsilon if epsilon is not None else min(budgets))
        if not 0 < self.epsilon < math.inf:
            raise ValueError(f"epsilon must be finite and > 0, got {self.epsilon}")

    def perturb(self, x, levels, generator=None):
        """x: [n, d] in [-1, 1] -> {"col": long [n], "value": float [n] in [-C, C]}.

        ``generator``: a torch.Generator or the client's CSPRNG (fedgraph.randomness.SecureRandom,
        the default noise source): draw through fedgraph.randomness, which takes both."""
        n, d = x.shape
        col = rng.randint(0, d, (n,), generator)
        v = x[torch.arange(n), col].double()
        e = math.exp(self.epsilon / 2)
        c = (e + 1) / (e - 1)
        left = (c + 1) / 2 * v - (c - 1) / 2
        right = left + c - 1
        inside = rng.rand(n, generator, torch.float64) < e / (e + 1)
        w = rng.rand(n, generator, torch.float64)
        outer = w * (2 * c - (right - left))  # a point on [-C, l) U (r, C], laid end to end
        value = torch.where(
            inside,
            left + w * (right - left),
            torch.where(outer < left + c, -c + outer, right + outer - (left + c)),
        )
        return {"col": col, "value": value.float()}

    def estimate(self, report, num_features):
        n = report["col"].numel()
        x_hat = torch.zeros(n, num_features)
        x_hat[torch.arange(n), report["col"]] = num_features * report["value"]
        return x_hat, None

    def privacy_spent(self, level):
        return {"piecewise": self.epsilon}


register_mechanism("piecewise", PiecewiseMechanism)  # also selectable as mechanism = "piecewise"
