"""ckptgw: a checkpoint gateway for ML training.

One distribution, one top-level name: the code lives in the repository's ``gateway/``,
``fsops/`` and ``drain/`` folders and is imported as ``ckptgw.gateway``, ``ckptgw.fsops`` and
``ckptgw.drain`` (pyproject.toml maps them; in a checkout the links in this folder do). The
store floor below them, ``ckptgw.store``, lives in this folder (``store/``)."""

__version__ = "0.1.0"
