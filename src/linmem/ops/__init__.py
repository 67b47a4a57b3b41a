"""The recurrences as registered PyTorch operators, with their references and kernels.

- :mod:`linmem.ops.lmn`: the LMN's recurrence (eqs. 6-7), ``linmem::lmn_scan`` and its backward,
  the per-step reference :func:`~linmem.ops.lmn.lmn_scan_ref`; :mod:`linmem.ops.lmn_fills`: its
  forward and backward by each path (the PyTorch loops, the CPU kernel's, the fused GPU
  kernels'); :mod:`linmem.ops.toolkit`: what the operators share (activations, buffer layout,
  eager calls without dispatch);
- :mod:`linmem.ops.paths`: which path runs the recurrences on a device (a kernel variant or the
  PyTorch loop on the CPU, the fused kernels or the loop on CUDA, each timed once;
  :func:`~linmem.ops.paths.use_cpu_kernel`, :func:`~linmem.ops.paths.use_gpu_kernel`);
- :mod:`linmem.ops.ulm`: the unrolled network's (eq. 10), ``linmem::ulm_scan``;
- :mod:`linmem.ops.rnns`: the baselines' (``torch.nn.RNN``'s, ``GRU``'s and ``LSTM``'s), with an
  explicit backward through time;
- :mod:`linmem.ops.bound`: the bounded memory matrix, and ``linmem::spectral_norm``, the exact
  norm of its reference;
- :mod:`linmem.ops.certified_norm`: ``linmem::bounded_scale``, the norm it runs with, certified
  from above (its certificates: :mod:`linmem.ops.certificates`; the top eigenpair:
  :mod:`linmem.ops.eigen`);
- :mod:`linmem.ops.cpu`: the compiled CPU kernel (``csrc/``): its build, variants and path;
- :mod:`linmem.ops.gpu`, :mod:`linmem.ops.triton_lmn`: the fused Triton kernels for CUDA.
"""

__all__: list[str] = []
