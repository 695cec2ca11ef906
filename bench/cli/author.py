"""`bench new-method` (an installable plugin package to start from) and `bench check-method` (the contract every
method meets, on any registered method)."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from acbench.core.errors import UserError

NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


def add_check_parser(sub) -> None:
    p = sub.add_parser("check-method", help="check registered methods against the method contract")
    p.add_argument("names", nargs="+", metavar="NAME", help="method names or variants (see `bench ls methods`)")


def cmd_check_method(args) -> int:
    from acbench.testing import check_method

    failed = 0
    for name in args.names:
        checks = check_method(name)
        bad = sum(c.passed is False for c in checks)
        failed += bad
        print(f"{name}: {'FAILS ' + str(bad) + ' of ' + str(len(checks)) if bad else 'meets'} the method contract")
        for c in checks:
            print(f"  {c.line()}")
    return 1 if failed else 0


def add_new_parser(sub) -> None:
    p = sub.add_parser("new-method", help="write an installable plugin package for a new method")
    p.add_argument("name", help="the method's name, lowercase words joined by '-' (e.g. my-svd)")
    p.add_argument("--family", choices=["low-rank", "sparsity"], required=True)
    p.add_argument("--form", choices=FORMS, default="function",
                   help="function (default): one decorated function that returns the basis or the scores; class: a "
                        "Compressor subclass, for a method that needs more (per-site factors, masks, thresholds)")
    p.add_argument("--output", default=None, help="parent folder of the package (default: the current folder)")


def cmd_new_method(args) -> int:
    out = new_method(args.name, args.family, Path(args.output or "."), args.form)
    print(f"wrote {out}: `pip install -e {out}`, then `bench check-method {args.name}` and "
          f"`bench smoke --methods {args.name} --no-latency`")
    return 0


def new_method(name: str, family: str, parent: Path, form: str = "function") -> Path:
    """The package folder for method `name`: pyproject (the entry point), the module (one decorated function, or a
    class), its tests, a README."""
    from acbench import methods

    if not NAME.fullmatch(name):
        raise UserError(f"method name {name!r} must be lowercase words joined by '-' (e.g. my-svd)")
    module = name.replace("-", "_")
    if keyword.iskeyword(module):
        raise UserError(f"method name {name!r} makes the Python keyword {module!r}: choose another name")
    if name in methods.known_methods():
        raise UserError(f"a method named {name} is registered already (`bench ls methods`): choose another name")
    if len(name) > MAX_NAME:
        raise UserError(f"method name {name[:20]}... is {len(name)} characters long: keep it to {MAX_NAME} (it names "
                        "a folder, a package and a test file)")
    if name in RESERVED or name.endswith("-analysis"):
        raise UserError(f"method name {name!r} is reserved by acbench (dense, all, and <analysis>-analysis name rows "
                        "and cells of their own): choose another name")
    clash = _installed_as(name, module)
    if clash:
        raise UserError(f"method name {name!r} is the name of {clash}: installing the plugin would replace or shadow "
                        "it; choose another name (e.g. my-" + name + ")")
    parent = _writable_parent(parent)
    out = parent / name
    if out.exists():
        raise UserError(f"{out} exists: remove it or pass --output elsewhere")
    cls = "".join(part.capitalize() for part in name.split("-"))
    if form not in FORMS:
        raise UserError(f"--form {form!r}: use one of {', '.join(FORMS)}")
    source = {("low-rank", "class"): LOW_RANK, ("sparsity", "class"): SPARSITY,
              ("low-rank", "function"): LOW_RANK_FUNCTION, ("sparsity", "function"): SPARSITY_FUNCTION}[family, form]
    test = {("low-rank", "class"): LOW_RANK_TEST, ("low-rank", "function"): PROJECTION_TEST}.get((family, form),
                                                                                                 SPARSITY_TEST)
    files = {
        "pyproject.toml": PYPROJECT.format(name=name, module=module, cls=cls),
        f"{module}/__init__.py": f'"""{name}: an acbench compression method."""\n',
        f"{module}/method.py": source.format(name=name, cls=cls),
        f"tests/test_{module}.py": test.format(name=name, module=module),
        "README.md": README.format(name=name, module=module, family=family),
    }
    # written whole or not at all: into a folder of its own beside the target, renamed into place at the end
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=parent))
    try:
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text, encoding="utf-8")
        tmp.rename(out)
    except OSError as e:
        raise UserError(f"cannot write the package into {parent} ({e.strerror or type(e).__name__}): pass "
                        "--output <a writable folder>") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


MAX_NAME = 64
FORMS = ("function", "class")
RESERVED = {"dense", "all", "none", "acbench"}
# acbench's own import package, and the repository's test folders: a plugin package of one of these names would
# shadow it on import
OWN_PACKAGES = {"acbench", "tests", "benchmarks"}


def _installed_as(name: str, module: str) -> str | None:
    """What an installed distribution or importable module already called `name` (or its module name) is, or None:
    `pip install -e` of a distribution named torch replaces torch."""
    import importlib.metadata
    import importlib.util

    if module in OWN_PACKAGES:
        return f"acbench's own package {module!r}"
    for dist in {name, module}:
        try:
            importlib.metadata.distribution(dist)
            return f"the installed distribution {dist!r}"
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = True  # a name the import system trips on is no name for a package
    return f"the importable module {module!r}" if found else None


def _writable_parent(parent: Path) -> Path:
    """--output: a folder that exists (or can be made) and can be written; one line naming it otherwise."""
    if parent.exists() and not parent.is_dir():
        raise UserError(f"--output {parent} is a file: pass a folder to write the package into")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--output {parent} cannot be made ({e.strerror or type(e).__name__}): pass a writable "
                        "folder") from None
    import os

    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--output {parent} is not writable: pass a writable folder")
    return parent


PYPROJECT = '''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "{name}: a compression method for acbench"
requires-python = ">=3.10"

[project.entry-points."acbench.methods"]
{name} = "{module}.method:{cls}"

[tool.setuptools]
packages = ["{module}"]
'''

LOW_RANK = '''"""{name}: per site, the truncated SVD of W diag(s), s the per-channel RMS of the input (sqrt of C's
diagonal), undone after (B <- B diag(s)^-1). Edit `solve`; bump `version` when the algorithm changes (an edit
recomputes its cells anyway: their key holds a digest of this package's code)."""

from dataclasses import dataclass

from acbench.core.linalg import check_finite
from acbench.methods.base import Compressor, site_svd_ops
from acbench.methods.svd import floored, scaled_truncated_factors


@dataclass(frozen=True)
class {cls}Settings:
    power: float = 1.0  # s ** power scales the inputs (0: plain SVD)


class {cls}(Compressor):
    name = "{name}"
    version = 1
    description = "SVD of W diag(rms(x))^power per site, then undone"
    needs = frozenset({{"C"}})  # E[x x^T]; see `bench ls methods` and docs/method-interface.md for the others
    per_site = True  # one factorisation per site weight (False: one projection B shared by the group)
    Settings = {cls}Settings

    def solve_ops(self, d_in, d_outs, k, pair_tokens):  # what `bench plan` prices
        return site_svd_ops(d_in, d_outs)

    def solve(self, weights, stats, k):
        """weights: {{site: W (d_out x d_in)}} and stats (a GroupStats) on the solve device, in the solve precision;
        k: {{site: rank}}. Returns (factors {{site: (A, B)}}, shared B?, fallback records, extras)."""
        C = stats.C.to(stats.solve_dtype)
        check_finite("{name}", C=C)
        fallbacks = []
        rms = floored(C.diagonal().clamp_min(0).sqrt(), "{name}", "dead-channel-floor", "channels", fallbacks)
        scale = rms ** self.settings.power
        factors = {{n: scaled_truncated_factors(W, k[n], inputs=scale) for n, W in weights.items()}}
        return factors, False, fallbacks, {{}}
'''

SPARSITY = '''"""{name}: per token, keep the input channels with the largest |x_j| * ||W[:, j]|| (the weight columns of every
site of the group), as an N:M pattern or a density. Edit `solve`; bump `version` when the algorithm changes (an
edit recomputes its cells anyway: their key holds a digest of this package's code)."""

from dataclasses import dataclass

from acbench.methods.base import SparseActivation, SparsityMethod, stacked_column_norms


@dataclass(frozen=True)
class {cls}Settings:
    power: float = 1.0  # the column norms' weight in the score (0: |x| alone)


class {cls}(SparsityMethod):
    name = "{name}"
    version = 1
    description = "keep |x_j| * ||W[:, j]||^power per token (N:M or a density)"
    needs = frozenset()  # data-free; ask for {{"abs_mean"}}, {{"C"}}, {{"abs_hist"}}, ... (docs/method-interface.md)
    Settings = {cls}Settings

    @classmethod
    def pattern_problem(cls, pattern):
        """Why this method cannot keep `pattern` (one line with the fix), or None: checked before a run starts."""
        return None

    def solve(self, weights, stats, pattern):
        """weights: {{site: W}} in float64 on the solve device; returns the per-token rule a layer deploys."""
        scale = stacked_column_norms(weights) ** self.settings.power
        return SparseActivation(pattern=pattern, scale=scale.float())
'''

LOW_RANK_FUNCTION = '''"""{name}: the group input projected on the top-k eigenvectors of D C D, C = E[x x^T] and D the input
channels' weight norms ||W[:, j]|| to a power (0: PCA). Edit the function; bump `version` when the algorithm changes
(an edit recomputes its cells anyway: their key holds a digest of this package's code)."""

from dataclasses import dataclass

import torch

from acbench.methods.base import stacked_column_norms
from acbench.methods.from_function import low_rank_method


@dataclass(frozen=True)
class {cls}Settings:
    power: float = 1.0  # the weight norms' say in the basis (0: plain PCA)


@low_rank_method("{name}", needs={{"C"}}, settings={cls}Settings, version=1,
                 description="top-k eigenvectors of D C D, D = diag(||W[:, j]||)^power")
def {cls}(stats, weights, k, settings):
    """stats: the group's statistics (stats.C: d_in x d_in), weights: {{site: W (d_out x d_in)}}, both on the solve
    device in the solve precision; k: the group's rank. Returns U (d_in x k, orthonormal columns): every site then
    reads U U^T x. `needs` names the statistics it reads (docs/method-interface.md lists them)."""
    d = stacked_column_norms(weights) ** settings.power
    _, vectors = torch.linalg.eigh(stats.C * d[:, None] * d[None, :])
    return vectors[:, -k:].flip(1)  # eigh sorts ascending: the top k, largest first
'''

SPARSITY_FUNCTION = '''"""{name}: per token, keep the input channels with the largest |x_j| * ||W[:, j]||^power (the weight columns
of every site of the group), as an N:M pattern or a density. Edit the function; bump `version` when the algorithm
changes (an edit recomputes its cells anyway: their key holds a digest of this package's code)."""

from dataclasses import dataclass

from acbench.methods.base import stacked_column_norms
from acbench.methods.from_function import sparsity_method


@dataclass(frozen=True)
class {cls}Settings:
    power: float = 1.0  # the column norms' weight in the score (0: |x| alone)


@sparsity_method("{name}", settings={cls}Settings, version=1,
                 description="keep |x_j| * ||W[:, j]||^power per token (N:M or a density)")
def {cls}(weights, settings):
    """weights: {{site: W}} in float64 on the solve device. Returns one factor >= 0 per input channel: each token
    keeps its channels with the largest |x_j| * factor_j. Data-free; `needs={{"abs_mean"}}` (or C, ...) in the
    decorator hands the function `stats` (docs/method-interface.md)."""
    return stacked_column_norms(weights) ** settings.power
'''

PROJECTION_TEST = '''"""{name} against the method contract and against a reference written here."""

import numpy as np
import torch

from acbench.testing import assert_method_contract


def reference(weights, stats, k):
    """What {name} should return: every site's W projected on the top-k eigenvectors of D C D (numpy's eigh)."""
    d = torch.sqrt(sum(W.pow(2).sum(0) for W in weights.values())).numpy()
    _, vectors = np.linalg.eigh(stats.C.numpy() * np.outer(d, d))
    U = torch.from_numpy(vectors[:, ::-1][:, :k].copy())
    return {{n: W @ U @ U.T for n, W in weights.items()}}


def test_{module}_meets_the_method_contract():
    assert_method_contract("{name}", reference=reference)
'''

LOW_RANK_TEST = '''"""{name} against the method contract and against a reference written here."""

import torch

from acbench.testing import assert_method_contract


def reference(weights, stats, k):
    """What {name} should return: per site, the rank-k truncation of W diag(s) by torch's SVD, unscaled."""
    s = stats.C.diagonal().sqrt()
    out = {{}}
    for n, W in weights.items():
        U, sig, Vh = torch.linalg.svd(W * s, full_matrices=False)
        out[n] = (U[:, :k[n]] * sig[:k[n]]) @ Vh[:k[n]] / s
    return out


def test_{module}_meets_the_method_contract():
    assert_method_contract("{name}", reference=reference)
'''

SPARSITY_TEST = '''"""{name} against the method contract and against a reference written here."""

import torch

from acbench.testing import assert_method_contract
from acbench.core.sparsity import topk_mask


def reference(x, weights, stats, pattern):
    """What {name} should keep of x (tokens x d_in): per token, the top |x_j| * ||W[:, j]|| of each block."""
    norms = torch.cat(list(weights.values())).double().norm(dim=0)
    return x * topk_mask(x.abs() * norms.float(), *pattern.topk_args(x.shape[-1]))


def test_{module}_meets_the_method_contract():
    assert_method_contract("{name}", reference=reference)
'''

README = '''# {name}

A {family} compression method for acbench, registered through the `acbench.methods` entry point.

```sh
pip install -e {name}              # then `bench ls methods` lists {name}
bench check-method {name}          # the method contract
pytest {name}/tests                # the contract and the reference in tests/test_{module}.py
bench smoke --methods {name} --no-latency
bench run --methods {name} pca --rank 0.5     # or --sparsity 0.5 / 2:4 for a sparsity method
```

The method is `{module}/method.py`; the statistics it may ask for, their shapes, and the result types are in
acbench's docs/adding-a-method.md.
'''
