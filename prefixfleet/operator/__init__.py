"""Control plane: PrefixCacheFleet models, planners and kopf handlers.

The code lives in the repository's top-level ``operator/`` folder, which deliberately has no
``__init__.py``: a regular package there would be importable as ``operator`` whenever the checkout
is on ``sys.path`` (``python -m ...`` from the repository root) and shadow the standard library's
``operator`` module. Wheels copy ``operator/*.py`` here (see ``package-dir`` in pyproject.toml);
in a checkout this file points the package at that folder.
"""

from pathlib import Path

_CHECKOUT_SOURCE = Path(__file__).resolve().parents[2] / "operator"
if _CHECKOUT_SOURCE.is_dir() and str(_CHECKOUT_SOURCE) not in __path__:
    __path__.append(str(_CHECKOUT_SOURCE))
