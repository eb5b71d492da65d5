"""Exact discrete Laplace and discrete Gaussian sampling: the stable public face of dpsql's noise.

All randomness in dpsql comes from one function, ``_random_bytes`` in :mod:`dpsql.noise.bits`,
which calls ``os.urandom`` at call time and raises :class:`~dpsql.errors.EntropyError` (nothing
is released) when the operating system cannot provide randomness; there is no seed and no
generator state. The samplers use integer arithmetic only, following Canonne, Kamath and
Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020, arXiv:2004.00010),
because floating point noise leaks through its low bits (Mironov, CCS 2012).

This module only re-exports; the implementations live in one module per concept:

* :mod:`dpsql.noise.bits`: the random bytes, exact uniform integers, Bernoulli(exp(-γ))
  (CKS 2020 Algorithm 1) and the masked-rejection batch filler;
* :mod:`dpsql.noise.laplace`: the discrete Laplace (CKS 2020 Algorithm 2), its pmf, tail and
  confidence half-width;
* :mod:`dpsql.noise.gaussian`: the discrete Gaussian (CKS 2020 Algorithm 3), its pmf, tail and
  confidence half-width.
"""

from __future__ import annotations

from dpsql.noise.bits import uniform_integers
from dpsql.noise.gaussian import (
    MAX_SIGMA2,
    discrete_gaussian,
    discrete_gaussian_half_width,
    discrete_gaussian_pmf,
    discrete_gaussian_tail,
)
from dpsql.noise.laplace import (
    MAX_SCALE,
    discrete_laplace,
    discrete_laplace_half_width,
    discrete_laplace_pmf,
    discrete_laplace_tail,
)

__all__ = [
    "MAX_SCALE",
    "MAX_SIGMA2",
    "discrete_gaussian",
    "discrete_gaussian_half_width",
    "discrete_gaussian_pmf",
    "discrete_gaussian_tail",
    "discrete_laplace",
    "discrete_laplace_half_width",
    "discrete_laplace_pmf",
    "discrete_laplace_tail",
    "uniform_integers",
]
