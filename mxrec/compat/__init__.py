"""mx_rec's module paths under mxrec: the one place that defines them.

Scripts written for Huawei's mx_rec run on mxrec once `mx_rec` is renamed `mxrec`, so every
path they import must exist under `mxrec.`. Where mx_rec's path is a real module of ours
(`mxrec.core.embedding`, `mxrec.graph.modifier`, ...) it is that module. The others are
listed here, in two tables, and nowhere else:

- `MODULES`: {mx_rec's module path: the module of ours that answers it}. Importing the path,
  `from path import name`, and reading it as an attribute of its package
  (`mxrec.util.communication`) all give the real module object itself, so a monkeypatch
  through the alias reaches the one module and its state.
- `NAMES`: {mx_rec's path of a name inside a module of ours: the module that defines it},
  for a name that moved to a higher layer (the hooks); the module of ours answers it as an
  attribute, importing the defining module on first use, so no import runs upward.

- `REFUSED_MODULES` and `REFUSED_NAMES` (in `refused.py`): {mx_rec's path: why mxrec does
  not have it} (NPU only, or mx_rec's internals with no counterpart). Importing such a
  path, or a name from such a module, raises `RefusedImport` (an ImportError) with the
  reason; a refused module under an alias module (`mxrec.util.communication.hccl_mgmt`)
  imports, as a module every name of which is refused, since Python imports it without
  asking a finder.

`install()` (run by `import mxrec`) puts a finder at the front of `sys.meta_path` that
answers the paths of `MODULES` and `REFUSED_MODULES` and gives the modules that host an
alias (a package that holds one, a module that names one) a module `__getattr__` when they
load. Adding an mx_rec path is one line in a table. `mxrec.compat.table` writes
docs/MX_REC_PATHS.md from these tables and what RecSDK imports (`recsdk_imports`).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types
from typing import Dict

from mxrec.compat.refused import REFUSED_MODULES, REFUSED_NAMES

MODULES: Dict[str, str] = {
    "mxrec.core.asc.manager": "mxrec.core.asc.helper",
    "mxrec.core.feature_process": "mxrec.hooks.evict",
    "mxrec.graph.acg_push_ops": "mxrec.hooks.acg_push_ops",
    "mxrec.util.communication": "mxrec.distributed.communication",
    "mxrec.util.communication.hccl_ops": "mxrec.distributed.hccl_ops",
    "mxrec.util.config_utils": "mxrec.util.config",
    "mxrec.util.config_utils.optimizer_utils": "mxrec.util.config",
    "mxrec.util.config_utils.train_param": "mxrec.util.config",
    "mxrec.util.config_utils.embedding_utils": "mxrec.util.config",
    # RecSDK 5.0's path of the constants.
    "mxrec.util.constants": "mxrec.constants.constants",
    "mxrec.util.global_env_conf": "mxrec.util.env",
    "mxrec.saver.saver": "mxrec.saver.checkpoint",
    "mxrec.util.initialize": "mxrec.initialize",
    # RecSDK's later releases ship the examples' shared helpers inside mx_rec.
    "mxrec.util.model_common": "mxrec.compat.model_common",
    "mxrec.util.tf_version_adapter": "mxrec.compat.tf_version_adapter",
}

NAMES: Dict[str, str] = {
    "mxrec.ASCEND_GLOBAL_HASHTABLE_COLLECTION": "mxrec.constants.constants",
    "mxrec.core.asc.FeatureSpec": "mxrec.core.asc.feature_spec",
    "mxrec.graph.modifier.GraphModifierHook": "mxrec.hooks.graph_modifier",
    # The hook's path beside mxrec's Saver, which mxrec's documentation gave as mx_rec's.
    "mxrec.saver.checkpoint.IncrementalCheckpointHook": "mxrec.hooks.incremental_checkpoint",
}

class RefusedImport(ImportError):
    """An mx_rec path or name that mxrec does not have, with the reason.

    An ImportError (not an AttributeError) so that `from path import name` shows the reason:
    Python replaces an AttributeError raised there with its own generic message.
    """


class _Refused(str):
    """A hosted attribute that is refused: its value is the reason."""


class _RefusedModule(types.ModuleType):
    """A refused mx_rec module under an alias (see _AliasLoader): any name read from it
    raises RefusedImport with the reason."""

    def __init__(self, name: str, reason: str):
        super().__init__(name, f"Refused on mxrec: {reason}")
        self.__refused__ = reason

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RefusedImport(f"{self.__name__} is not available on mxrec: {self.__refused__}",
                            name=self.__name__)


def _refused_module(fullname: str):
    """The reason an mx_rec module path (or the package above it) is refused, else None."""
    path = fullname
    while path:
        if path in REFUSED_MODULES:
            return path, REFUSED_MODULES[path]
        path = path.rpartition(".")[0]
    return None


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0]


def _hosted() -> Dict[str, Dict[str, str]]:
    """{module that hosts aliases: {attribute: "module" or the module defining the name}}
    for the hosts that are real modules (an alias under an alias is loaded with it)."""
    hosts: Dict[str, Dict[str, str]] = {}
    for path in MODULES:
        if _parent(path) not in MODULES:
            hosts.setdefault(_parent(path), {})[path.rsplit(".", 1)[1]] = "module"
    for path, defining in NAMES.items():
        hosts.setdefault(_parent(path), {})[path.rsplit(".", 1)[1]] = defining
    for path, reason in REFUSED_NAMES.items():
        hosts.setdefault(_parent(path), {})[path.rsplit(".", 1)[1]] = _Refused(reason)
    return hosts


def _attribute_hook(module, attributes: Dict[str, str]):
    """A module `__getattr__` answering `attributes`, then the module's own, if it has one."""
    own = module.__dict__.get("__getattr__")

    def __getattr__(name: str):
        found = attributes.get(name)
        if isinstance(found, _Refused):
            raise RefusedImport(f"{module.__name__}.{name} is not available on mxrec: {found}",
                                name=module.__name__)
        if found == "module":
            return importlib.import_module(f"{module.__name__}.{name}")
        if found is not None:
            return getattr(importlib.import_module(found), name)
        if own is not None:
            return own(name)
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

    return __getattr__


class _AliasLoader(importlib.abc.Loader):
    """Loads an mx_rec path as the real module (and the aliases under it, which cannot be
    imported through a module that is not a package)."""

    def create_module(self, spec):
        del spec  # the default module, replaced in sys.modules by exec_module

    def exec_module(self, module) -> None:
        real = importlib.import_module(MODULES[module.__name__])
        for child, target in MODULES.items():
            if _parent(child) == module.__name__:
                sys.modules[child] = importlib.import_module(target)
                setattr(real, child.rsplit(".", 1)[1], sys.modules[child])
        for child, reason in REFUSED_MODULES.items():
            # Python imports a child of a module that is not a package without asking the
            # finders, so a refused one is in place already: every name from it is refused.
            if _parent(child) == module.__name__:
                sys.modules[child] = _RefusedModule(child, reason)
                setattr(real, child.rsplit(".", 1)[1], sys.modules[child])
        # The import system returns what sys.modules holds once exec_module is done.
        sys.modules[module.__name__] = real


class _HostLoader(importlib.abc.Loader):
    """The real module's own loader, which adds the alias `__getattr__` after it ran."""

    def __init__(self, loader, attributes: Dict[str, str]):
        self._loader = loader
        self._attributes = attributes

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        module.__getattr__ = _attribute_hook(module, self._attributes)

    def __getattr__(self, name: str):
        # get_source, get_filename, is_package, ...: the real loader's.
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self._hosts = _hosted()

    def find_spec(self, fullname, path, target=None):
        refused = _refused_module(fullname)
        if refused is not None:
            where = "" if refused[0] == fullname else f" (the package {refused[0]})"
            raise RefusedImport(f"{fullname}{where} is not available on mxrec: {refused[1]}",
                                name=fullname)
        if fullname in MODULES:
            return importlib.util.spec_from_loader(fullname, _AliasLoader())
        attributes = self._hosts.get(fullname)
        if attributes is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                spec.loader = _HostLoader(spec.loader, attributes)
                return spec
        return None


def install() -> None:
    """Makes mx_rec's paths importable (once per process); `import mxrec` calls it."""
    if any(isinstance(finder, _Finder) for finder in sys.meta_path):
        return
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    for host, attributes in _hosted().items():
        module = sys.modules.get(host)  # `mxrec` itself is loaded before its finder
        if module is not None:
            module.__getattr__ = _attribute_hook(module, attributes)
