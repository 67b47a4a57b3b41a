"""The models' modules: the LMN layer and its unrolled network (:mod:`linmem.nn.lmn`), the
baselines' recurrences (:mod:`linmem.nn.rnns`), the RNN-RBM (:mod:`linmem.nn.rnnrbm`), the NADE
readout (:mod:`linmem.nn.nade`), the readout's input path (:mod:`linmem.nn.readout`) and
diagnostics of a memory (:mod:`linmem.nn.diagnostics`)."""

__all__: list[str] = []
