"""Build of the optional compiled core; everything else is in pyproject.toml.

The core modules (``_wheel``, ``_timer``, ``_operation``, ``_purgatory``) are plain
Python. Where Cython and a C compiler are available, each is also compiled to a
C extension from the very same ``.py`` file, with the types declared in the
``.pxd`` file beside it (Cython's "augmenting .pxd" pure-Python mode). The
extension, when present, is imported instead of the ``.py`` file.

No compiler (or ``AIOPURGATORY_NO_EXTENSIONS=1`` at build time): the package is
installed as pure Python, with a warning, never a failed install.

The examples (``examples/``) are not part of the distribution: no wheel installs
them. A checkout installed in editable mode (``make install``, ``pip install -e .``)
maps them too, so that ``python -m examples.NAME`` runs from any directory.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.editable_wheel import editable_wheel

ROOT = Path(__file__).parent

# A core module is compiled where it has a .pxd file beside it (the same set as
# aiopurgatory/_compiled.py's CORE_MODULES; a test checks that).
CORE = sorted(path.stem for path in ROOT.glob("aiopurgatory/_*.pxd"))


def _no_extensions() -> bool:
    return os.environ.get("AIOPURGATORY_NO_EXTENSIONS", "") not in ("", "0")


class OptionalBuildExt(build_ext):
    """Build the extensions if possible; otherwise say so and install pure Python.

    Cython runs here, when the extensions are built, not when setup.py is read:
    making an sdist, reading metadata or installing without a working C compiler
    costs no Cython time (``CC=false pip install aiopurgatory-*.tar.gz`` installs
    the pure core at once). The modules are translated and compiled in parallel,
    on every core (``-j N`` still chooses).
    """

    failure: Exception | None = None

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = True  # distutils: as many jobs as cores

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no Cython, missing headers, ...
            self.failure = exc
        if self.failure is not None:
            # Leave no partial set behind: the compiled modules cimport each other.
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.remove(path)
            print(
                f"WARNING: aiopurgatory's compiled core could not be built "
                f"({self.failure}); installing the pure-Python implementation.",
                file=sys.stderr,
            )

    def build_extensions(self) -> None:
        if self.extensions:
            self._check_compiler()
            # The C sources into the extensions setuptools has prepared (it keeps
            # state of its own on them): Cython's copies carry only the sources.
            # Cython's C next to the sources for a build in place (make build: it
            # is kept, so that an unchanged module is not translated again), else
            # in the build's own temporary directory (see _out_of_tree).
            build_dir = None if self.inplace else self.build_temp
            translated = {ext.name: ext.sources for ext in _cythonize(self.extensions, build_dir)}
            for ext in self.extensions:
                ext.sources = translated[ext.name]
        super().build_extensions()

    def _check_compiler(self) -> None:
        # One line of C first: without a working compiler, translating the modules
        # (most of a build's Python time) would be for nothing.
        with tempfile.TemporaryDirectory() as tmp:
            source = os.path.join(tmp, "check.c")
            with open(source, "w") as f:
                f.write("int main(void) { return 0; }\n")
            self.compiler.compile([source], output_dir=tmp)

    def build_extension(self, ext: Extension) -> None:
        if self.failure is not None:
            return
        try:
            super().build_extension(ext)
        except Exception as exc:
            self.failure = exc


class EditableWithExamples(editable_wheel):
    """An editable install of a checkout maps the ``examples`` package beside the library.

    Only the editable install: the packages of a wheel (and of the sdist's wheel)
    are pyproject.toml's ``packages.find``, which leaves ``examples`` out. A
    top-level ``examples`` package in site-packages would clash with any other
    project's; a checkout's own venv is where the examples are meant to run.
    """

    def run(self) -> None:
        packages = list(self.distribution.packages or [])
        found = find_packages(str(ROOT), include=["examples", "examples.*"])
        self.distribution.packages = packages + [p for p in found if p not in packages]
        super().run()


def _histogram_macros() -> list[tuple[str, str]]:
    # AIOPURGATORY_NO_HISTOGRAMS=1 builds a core that records no histograms, only
    # to measure what they cost (docs/benchmarks.md); never for production.
    if os.environ.get("AIOPURGATORY_NO_HISTOGRAMS", "") not in ("", "0"):
        print("AIOPURGATORY_NO_HISTOGRAMS is set: histograms compiled out.", file=sys.stderr)
        return [("AIOPURGATORY_HISTOGRAMS", "0")]
    return []


def _extensions() -> list[Extension]:
    if _no_extensions():
        print("AIOPURGATORY_NO_EXTENSIONS is set: pure-Python build.", file=sys.stderr)
        return []
    # From the .py sources: OptionalBuildExt translates them with Cython.
    return [
        Extension(
            f"aiopurgatory.{name}",
            [f"aiopurgatory/{name}.py"],
            # Cython caches "this class does not override that cpdef method" by
            # the version of the instance's own class dict; a method patched onto
            # a base class later (unittest.mock.patch.object) would be missed.
            define_macros=[("CYTHON_USE_DICT_VERSIONS", "0"), *_histogram_macros()],
        )
        for name in CORE
    ]


def _cythonize(modules: list[Extension], build_dir: str | None) -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        raise RuntimeError("Cython is not installed") from None
    extensions: list[Extension] = cythonize(
        modules,
        compiler_directives={
            "language_level": 3,
            # Annotations are for mypy; Cython's types come from the .pxd files
            # only, so that the compiled core checks and converts arguments exactly
            # as the Python source does.
            "annotation_typing": False,
            "embedsignature": True,
        },
        nthreads=os.cpu_count() or 1,
        quiet=True,
        build_dir=build_dir,
    )
    return extensions


def _out_of_tree() -> dict[str, dict[str, str]]:
    """Where a build writes, so that building from a checkout leaves it unchanged.

    pip and uv build a directory's wheel in that directory (``pip install
    ./checkout``, ``python -m build``): setuptools would write its ``build/`` tree,
    the ``aiopurgatory.egg-info`` metadata and Cython's C files into the checkout.
    They go to a temporary directory of this process instead, removed when it
    ends (the wheel is written elsewhere by then). A build in place (``make
    build``'s ``build_ext --inplace``, an editable install) keeps setuptools'
    defaults: its products belong in the checkout, ignored by git.
    """
    in_place = any(arg in ("--inplace", "-i", "develop", "editable_wheel") for arg in sys.argv)
    if in_place:
        return {}
    scratch = tempfile.mkdtemp(prefix="aiopurgatory-build-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    return {
        "build": {"build_base": os.path.join(scratch, "build")},
        "egg_info": {"egg_base": scratch},
    }


setup(
    ext_modules=_extensions(),
    cmdclass={"build_ext": OptionalBuildExt, "editable_wheel": EditableWithExamples},
    options=_out_of_tree(),
)
