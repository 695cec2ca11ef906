"""One plugin mechanism for methods, tasks and analyses.

A plugin is a class with a `name`, a `version` (it enters the key of every result it produces, so a changed
algorithm never reuses old cells) and a frozen `Settings` dataclass. A registry finds its plugins in two places:
every module of its own package (a new file there is registered with no list to edit) and an entry-point group
(`acbench.methods`, `acbench.tasks`, `acbench.analyses`) for plugins that live in other distributions.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
import pkgutil
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points, packages_distributions, version as dist_version
from pathlib import Path
from typing import ClassVar

from .errors import UserError, did_you_mean, exception_line
from .log import warn
from .settings import check_settings


@dataclass(frozen=True)
class NoSettings:
    pass


ADDED_LATER = "added_later"  # dataclass field metadata: the setting is left out of a result's key at its default


def added_setting(default):
    """A setting added after results were stored: at its default it is left out of `settings_dict` (the key of
    every result), so the stored results keep their keys and a run at the default plans none of them again; set to
    anything else it enters the key as every setting does."""
    return dataclasses.field(default=default, metadata={ADDED_LATER: True})


def keyed_settings(settings) -> dict:
    """A Settings dataclass as its results' key holds it: every field, less those added later left at default."""
    out = dataclasses.asdict(settings)
    for f in dataclasses.fields(settings):
        if f.metadata.get(ADDED_LATER) and out.get(f.name) == f.default:
            del out[f.name]
    return out


class Plugin:
    """What methods, tasks and analyses share: identity, version and settings built from `key=value` options."""

    kind: ClassVar[str] = "plugin"
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    version: ClassVar[int] = 1
    Settings: ClassVar[type] = NoSettings

    def __init__(self, settings=None):
        self.settings = settings if settings is not None else self.Settings()

    @classmethod
    def from_options(cls, options: dict | None = None):
        """Settings from options (None values mean "the default"); unknown names and bad types are refused."""
        names = {f.name for f in dataclasses.fields(cls.Settings)}
        options = {k: v for k, v in (options or {}).items() if v is not None}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ValueError(f"{cls.kind} '{cls.name}' has no setting {', '.join(unknown)}; its settings are: "
                             f"{', '.join(sorted(names)) or '(none)'}")
        settings = cls.Settings(**options)
        check_settings(settings, f"{cls.kind} '{cls.name}'")
        return cls(settings)

    def settings_dict(self) -> dict:
        return keyed_settings(self.settings)


# the package whose modules each hold their own plugins: a plugin there is keyed by its own file; a plugin elsewhere
# (an installed distribution) by every Python file of its top-level package, since it may import its helpers
PROJECT_PACKAGES = ("acbench",)


def _digest(files: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@functools.cache
def code_provenance(cls: type) -> dict:
    """Where a plugin's code comes from and a digest of it: the key of its results includes the digest, so an edit
    recomputes them even when `version` was not bumped. {module, files, code_digest, distribution,
    distribution_version}; the distribution is None for the project's own plugins and for a module on the path."""
    top = cls.__module__.partition(".")[0]
    try:
        source = Path(inspect.getfile(cls)).resolve()
    except (TypeError, OSError):  # defined in __main__ or an interactive session: no file to read
        return {"module": cls.__module__, "files": 0, "code_digest": None, "distribution": None,
                "distribution_version": None}
    if top in PROJECT_PACKAGES or not hasattr(sys.modules[top], "__path__"):
        files, root = [source], source.parent
    else:  # a plugin package: all of it
        root = Path(next(iter(sys.modules[top].__path__))).resolve()
        files = [f for f in root.rglob("*.py") if "__pycache__" not in f.parts]
    dists = [] if top in PROJECT_PACKAGES else packages_distributions().get(top, [])
    dist = dists[0] if dists else None
    return {"module": cls.__module__, "files": len(files), "code_digest": _digest(files, root),
            "distribution": dist, "distribution_version": dist_version(dist) if dist else None}


def code_key(cls: type) -> str | None:
    """The code digest a plugin's result keys carry, or None for the project's own plugins: those are keyed by
    `version` alone, which their pinned-key and golden tests hold to the code (and a refactor of a built-in does
    not recompute every stored result); an installed plugin's author gets an edit recomputed without a bump."""
    return None if cls.__module__.partition(".")[0] in PROJECT_PACKAGES else code_provenance(cls)["code_digest"]


class UnknownName(UserError, KeyError):
    """A name no registry knows; the message carries the closest known name."""

    def __str__(self):
        return self.args[0]


def entry_point_distribution(ep) -> str | None:
    """The name of the distribution that declares entry point `ep` (None where importlib does not say)."""
    return getattr(getattr(ep, "dist", None), "name", None)


def entry_point_origin(ep) -> str:
    """'entry point NAME = VALUE of distribution D': where a plugin comes from, for the line that names it."""
    return f"entry point {ep.name} = {ep.value} of distribution {entry_point_distribution(ep) or '(unknown)'}"


def load_entry_point(ep, accepts, what: str) -> tuple[object | None, str | None]:
    """(the loaded object, None), or (None, one line naming the entry point, its distribution, the problem and the
    fix): a plugin that does not import, or is not `what`, is reported, never raised, so that one broken
    distribution leaves every other plugin and command usable."""
    try:
        obj = ep.load()
    except Exception as e:  # any import failure of someone else's code: ImportError, SyntaxError, a raise at import
        return None, f"{entry_point_origin(ep)} does not import ({exception_line(e)}): fix or uninstall that distribution"
    if not accepts(obj):
        return None, f"{entry_point_origin(ep)} is not {what}: fix the plugin's packaging"
    return obj, None


class Registry:
    def __init__(self, kind: str, package: str, base: type, group: str, plural: str | None = None):
        self.kind, self.package, self.base, self.group = kind, package, base, group
        self.plural = plural or f"{kind}s"
        self._classes: dict[str, type] = {}
        self._broken: dict[str, str] = {}  # entry-point name -> the line saying why it is not usable
        self._distributions: dict[str, str] = {}  # plugin name -> the distribution whose entry point registered it
        self._loaded = False

    def register(self, cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"{cls!r} is not a {self.base.__name__} subclass")
        if not cls.name:
            raise ValueError(f"{cls.__name__} has no name")
        self._classes[cls.name] = cls
        return cls

    def unregister(self, name: str) -> None:
        self._classes.pop(name, None)

    def reload(self) -> None:
        """Look for plugins again (a distribution installed since the first lookup)."""
        self._loaded = False

    def _is_plugin(self, obj) -> bool:
        return isinstance(obj, type) and issubclass(obj, self.base) and bool(getattr(obj, "name", ""))

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        self._broken = {}
        pkg = importlib.import_module(self.package)
        own = set()
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.ispkg or info.name.startswith("_"):
                continue
            module = importlib.import_module(f"{self.package}.{info.name}")
            for obj in vars(module).values():
                # only classes defined in that module: an imported base or sibling is registered where it lives
                if (isinstance(obj, type) and issubclass(obj, self.base) and obj.__module__ == module.__name__
                        and obj.name):
                    self._classes.setdefault(obj.name, obj)
                    own.add(obj.name)
        for ep in entry_points(group=self.group):
            cls, problem = load_entry_point(ep, self._is_plugin, f"a named {self.base.__name__} subclass")
            if cls is not None and cls.name in own and self._classes.get(cls.name) is not cls:
                problem = (f"{entry_point_origin(ep)} registers {self.kind} '{cls.name}', the name of acbench's own "
                           f"{self.kind}, which stays: rename the plugin's {self.kind}")
            if problem:
                self._broken[ep.name] = problem
                warn(f"{self.kind} plugin skipped: {problem}")
                continue
            self.register(cls)
            dist = entry_point_distribution(ep)
            if dist:
                self._distributions[cls.name] = dist

    def origin(self, name: str) -> str | None:
        """None for acbench's own plugins; else where the plugin's code comes from, for the line that names it when
        it fails: 'plugin of distribution D' (its entry point's, else its package's) or 'plugin in module M' (one
        defined in a script or notebook)."""
        cls = self.get(name)
        if cls.__module__.partition(".")[0] in PROJECT_PACKAGES:
            return None
        dist = self._distributions.get(name) or code_provenance(cls)["distribution"]
        return f"plugin of distribution {dist}" if dist else f"plugin in module {cls.__module__}"

    def names(self) -> list[str]:
        self._load()
        return sorted(self._classes)

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._classes

    def get(self, name: str) -> type:
        self._load()
        if name not in self._classes:
            if name in self._broken:
                raise UnknownName(f"{self.kind} '{name}' is installed but not usable: {self._broken[name]}")
            raise UnknownName(f"unknown {self.kind} '{name}'.{did_you_mean(name, self._classes)} "
                              f"See `bench ls {self.plural}`.")
        return self._classes[name]
