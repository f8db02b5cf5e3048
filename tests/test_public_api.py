"""The public surface: every name in ``__all__`` exists, and nothing public is left out."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "aioelastic",
    "aioelastic.errors",
    "aioelastic.events",
    "aioelastic.rendezvous",
    "aioelastic.agent",
    "aioelastic.store",
    "aioelastic.sync",
    "aioelastic.timer",
    "aioelastic.testing",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr} is in __all__ but missing"


@pytest.mark.parametrize("name", MODULES)
def test_public_classes_and_functions_are_exported(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and (isinstance(value, type) or callable(value))
        and getattr(value, "__module__", "").startswith("aioelastic")
    }
    assert public <= set(module.__all__), sorted(public - set(module.__all__))


def test_every_error_derives_from_the_base() -> None:
    errors = importlib.import_module("aioelastic.errors")
    for attr in errors.__all__:
        value = getattr(errors, attr)
        assert issubclass(value, errors.AioelasticError), attr
        doc = errors.__doc__ or ""
        assert attr in doc or value.__name__ in doc, (
            f"{attr} is missing from the hierarchy drawn in the errors docstring"
        )


def test_torch_compatible_error_bases() -> None:
    from aioelastic import errors

    assert issubclass(errors.RendezvousClosedError, RuntimeError)
    assert issubclass(errors.StoreConnectionError, ConnectionError)
    assert issubclass(errors.WriteOutcomeUnknownError, errors.StoreConnectionError)
    assert errors.TimeoutException is errors.TimerExpiredError


def test_importing_the_package_loads_no_optional_backend() -> None:
    import subprocess
    import sys

    # grpc/google: the etcd backend's; aiohttp (yarl, multidict): the http backend's and the
    # metrics endpoint's; prometheus_client: the agent's metrics; torch: the torchrun plugin's
    optional = ("grpc", "google", "aiohttp", "yarl", "multidict", "prometheus_client", "torch")
    packages = ", ".join(["aioelastic", *MODULES[1:]])
    code = (
        f"import sys, {packages};"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {optional!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_facade_exports_every_error() -> None:
    """The facade's error list is errors.__all__ itself, so it cannot drift (it had lost
    RendezvousNotFoundError)."""
    import aioelastic
    from aioelastic import errors

    assert set(errors.__all__) <= set(aioelastic.__all__)
    for name in errors.__all__:
        assert getattr(aioelastic, name) is getattr(errors, name)


@pytest.mark.parametrize("name", MODULES)
def test_public_names_show_a_public_module(name: str) -> None:
    """``Store.__module__`` was ``aioelastic.store._base``: reprs, help() and tracebacks showed
    a private path."""
    module = importlib.import_module(name)
    for attr in module.__all__:
        value = getattr(module, attr)
        if not (isinstance(value, type) or callable(value)):
            continue
        where = getattr(value, "__module__", "") or ""
        if not where.startswith("aioelastic"):
            continue  # re-exported from elsewhere (e.g. a builtin alias)
        private = [part for part in where.split(".") if part.startswith("_")]
        assert not private, f"{name}.{attr}.__module__ is {where!r}"
