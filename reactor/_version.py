"""The installed version of reactor (distribution ``reactor-state``)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("reactor-state")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0.0.0"
