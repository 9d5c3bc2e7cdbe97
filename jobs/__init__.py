"""The reusable job platform (distribution ``django-consistent-jobs``). Never imports
``accounts``."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("django-consistent-jobs")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
