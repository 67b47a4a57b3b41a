"""The largest eigenpair of a symmetric matrix (a Gram matrix ``V^T V``), alone: what the exact
spectral norm (:func:`linmem.ops.bound.spectral_norm`) is made of, and the certified norm's
fallback (:mod:`linmem.ops.certified_norm`)."""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

__all__ = ["blas_controller", "top_eigenpair", "top_eigenpair_lapack"]


@functools.cache
def blas_controller():
    """threadpoolctl's handle on the BLAS libraries loaded once scipy's LAPACK is (made once: it
    scans the process's libraries)."""
    import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS, which the controller then sees)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def top_eigenpair_lapack(gram: Tensor) -> tuple[float, Tensor]:
    """The largest eigenvalue of a symmetric CPU matrix and a unit eigenvector: that pair alone
    (LAPACK's ``syevr`` by index), not the whole spectrum, on one BLAS thread.

    scipy's OpenBLAS sizes its thread pool to the machine, not to torch's thread count, and its
    threads spin while they wait: beside one busy process on two cores the pair of a 250 x 250
    matrix took 4.4 ms on its two threads against 1.6 ms on one (and up to 9 ms in a training
    step), where a quiet machine's second thread saves little on a matrix this small.

    Where the largest eigenvalues form a tight cluster (a memory put into the ball by
    :func:`linmem.pretrain.project_memory`: its singular values above the bound all set to it),
    LAPACK's float32 MRRR can return no pair at all (4 in 40 such 250 x 250 matrices here): the
    whole spectrum's solver (:func:`top_eigenpair`, divide and conquer) answers then."""
    import scipy.linalg  # here: importing it costs 0.4 s, and only a bounded memory needs it

    n = gram.shape[0]
    try:
        with blas_controller().limit(limits=1, user_api="blas"):
            lam, vec = scipy.linalg.eigh(gram.numpy(), subset_by_index=[n - 1, n - 1],
                                         driver="evr", check_finite=False)
    except np.linalg.LinAlgError:
        lam = ()
    if len(lam) == 0:  # MRRR can find nothing in a tight cluster: the whole spectrum instead
        return top_eigenpair(gram)
    return float(lam[0]), torch.from_numpy(np.ascontiguousarray(vec[:, 0]))


def top_eigenpair(gram: Tensor) -> tuple[float, Tensor]:
    """The same pair from the whole spectrum (``torch.linalg.eigh``), on any device."""
    values, vectors = torch.linalg.eigh(gram)
    return float(values[-1]), vectors[:, -1]
