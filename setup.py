"""Build hook for kstore's optional native record codec (kstore/_codec.c).

Everything else about the package is declared in pyproject.toml. The extension is optional: on a
machine without a C compiler (or without Python's headers) `pip install` still succeeds, prints one
notice, and kstore runs its pure-Python codec (kstore/records.py), which is the reference anyway.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _notice(error: Exception) -> None:
    print(f"kstore: native codec not built ({type(error).__name__}: {error}); kstore will use its "
          f"pure-Python codec (slower, same results)", flush=True)


class OptionalBuildExt(build_ext):
    """Turn a failed compile into one clear line instead of a traceback."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler found at all
            _notice(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # compiler or headers missing, compile error
            _notice(e)


setup(
    ext_modules=[Extension("kstore._codec", ["kstore/_codec.c"], optional=True,
                           extra_compile_args=["-O2"])],
    cmdclass={"build_ext": OptionalBuildExt},
)
