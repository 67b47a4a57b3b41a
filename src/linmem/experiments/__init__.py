"""The paper's experiments, above the library: the grids and searches, finished studies,
progress, the tables and figures, the seeds, the ablations, the protocol choice and analyses of
runs. The library (``linmem.*`` outside this package and :mod:`linmem.cli`) never imports it."""

__all__: list[str] = []
