"""The model registry: what the trainer, the search, the report and the command line know of each
model (:class:`ModelSpec`: its name, the network behind it, how it is built, its options and
activations, its pretraining recipe), by name. :mod:`linmem.models` registers the built-in
models; :func:`register` adds one of a user's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from linmem.model_options import ModelOptions

__all__ = ["REGISTRY", "ModelSpec", "get_spec", "model_names", "register", "unregister"]


@dataclass(frozen=True)
class ModelSpec:
    """One model that the trainer, the search, the report and the command line know.

    Attributes:
        name: the registry name (``--model``).
        display: the name in tables (Table 2's row label).
        architecture: the network behind it (``pret-lmn-b`` is an ``lmn-b``).
        build: ``build(input_size, options)`` -> the model, ``options`` an instance of
            :attr:`options` (see :func:`linmem.models.build_model`); the model must implement the
            trainer's protocol (see :class:`linmem.models.NextStepPredictor`).
        options: its options: :class:`~linmem.model_options.ModelOptions` or a subclass with
            its own fields (those of :class:`~linmem.training.config.TrainConfig` it reads; a
            field of another model's class whose default is ``None`` is refused when set).
        has_memory: takes a memory size (the LMNs); ``memory`` is ``None`` for the others.
        nonlinearities: the activations it accepts.
        default_nonlinearity: the one it uses unless told otherwise.
        single_layer: accepts ``num_layers = 1`` only.
        dropout: accepts dropout.
        recipe: the name of its initialisation in :data:`linmem.training.recipes.RECIPES`
            (pretraining), or ``None``.
    """

    name: str
    display: str
    architecture: str
    build: Callable[[int, Any], nn.Module]
    options: type[ModelOptions] = ModelOptions
    has_memory: bool = False
    nonlinearities: tuple[str, ...] = ("tanh",)
    default_nonlinearity: str = "tanh"
    single_layer: bool = False
    dropout: bool = True
    recipe: str | None = None


REGISTRY: dict[str, ModelSpec] = {}


def register(spec: ModelSpec, replace: bool = False) -> ModelSpec:
    """Add ``spec`` to the registry (``replace`` an existing entry of that name)."""
    if spec.name in REGISTRY and not replace:
        raise ValueError(f"a model named {spec.name!r} is registered already")
    REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a model from the registry (a test's temporary model, say)."""
    REGISTRY.pop(name, None)


def get_spec(name: str) -> ModelSpec:
    """The registry entry of ``name``; ``ValueError`` naming the choices if there is none."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}: choose one of "
                         f"{', '.join(REGISTRY)}") from None


def model_names() -> tuple[str, ...]:
    """Every registered model, in registration order."""
    return tuple(REGISTRY)
