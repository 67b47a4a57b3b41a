"""Training a model: what defines a run (:mod:`linmem.training.config`), the trainer
(:mod:`linmem.training.trainer`), a run directory's files (:mod:`linmem.training.runs`) and the
recipes that pretrain before training (:mod:`linmem.training.recipes`)."""

__all__: list[str] = []
