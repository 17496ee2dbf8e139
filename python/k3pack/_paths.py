"""os.PathLike arguments for the C++ bindings, which take std::string.

accepts_paths(f) wraps a callable; accept_paths_in(cls, ...) wraps a class's
constructor (and the static methods named) in place, so the class itself,
isinstance() and instances the C++ side creates are unchanged. Every
argument, positional or keyword, that is an os.PathLike becomes
os.fspath(arg); so does every os.PathLike item of a list or tuple and every
os.PathLike key of a dict (e.g. create_manifest's known_shard_sha256). A str
holding a NUL byte is refused (ValueError), as open() refuses it: C++ would
read the path only up to it. Any other value is passed as it is (the binding
then checks it as before)."""

import functools
import os

__all__ = ["fspath_arg", "fspath_str", "accepts_paths", "accept_paths_in"]

_MARK = "__k3pack_accepts_paths__"


def _refuse_nul(value, where):
    """A str with a NUL reached C++ as a path cut at the NUL: another file
    was opened (GGUFFile(shard + '\\0junk') opened the shard) or the pack
    itself was read as its sidecar. Refused as open() refuses it."""
    if isinstance(value, str) and "\0" in value:
        raise ValueError(f"embedded null byte in {where}")
    return value


def fspath_arg(value, where="an argument"):
    """os.fspath(value) for an os.PathLike, the same list/tuple/dict with its
    os.PathLike items (dict: keys) converted, else value itself. A str
    holding a NUL, there or among the items and keys, is a ValueError naming
    `where`."""
    if isinstance(value, os.PathLike):
        return _refuse_nul(os.fspath(value), where)
    kind = type(value)
    if kind is list or kind is tuple:
        for item in value:
            _refuse_nul(item, where)
        if any(isinstance(item, os.PathLike) for item in value):
            return kind(fspath_arg(item, where) if isinstance(item, os.PathLike) else item for item in value)
    elif kind is dict:
        for key in value:
            _refuse_nul(key, where)
        if any(isinstance(key, os.PathLike) for key in value):
            return {fspath_arg(key, where) if isinstance(key, os.PathLike) else key: item for key, item in value.items()}
    return _refuse_nul(value, where)


def fspath_str(value, keyword):
    """os.fspath(value) for a path the Python side opens or keeps itself,
    which must be a str: str(value) of None or bytes was a path of its own
    ("None", "b'/m.json'"), refused later as a missing file under a name the
    caller never passed. Anything else is a TypeError naming `keyword`."""
    path = fspath_arg(value, keyword)
    if isinstance(path, str):
        return path
    shown = type(path).__name__
    if isinstance(path, bytes):
        shown += " (bytes paths are not supported: pass os.fsdecode(path))"
    raise TypeError(f"{keyword} must be a str or os.PathLike[str], got {shown}")


def accepts_paths(func, _skip=0):
    """func, taking os.PathLike wherever it takes a path string (see the
    module docstring). The wrapper keeps func's name, docstring and
    signature (functools.wraps); wrapping twice wraps once. _skip: leading
    arguments the caller did not pass (a method's self), not numbered in
    the NUL refusal's "argument N"."""
    if getattr(func, _MARK, False):
        return func

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*[fspath_arg(a, f"argument {i + 1 - _skip}") if i >= _skip else a for i, a in enumerate(args)],
                    **{k: fspath_arg(v, k) for k, v in kwargs.items()})

    setattr(wrapper, _MARK, True)
    return wrapper


def accept_paths_in(cls, *static_methods):
    """Makes cls's constructor, and the static methods named, take
    os.PathLike paths; returns cls (the same class, changed in place)."""
    init = cls.__dict__.get("__init__")
    if init is not None and not getattr(init, _MARK, False):
        cls.__init__ = accepts_paths(init, _skip=1)  # self is not an argument the caller passed
    for name in static_methods:
        method = cls.__dict__[name]
        if not isinstance(method, staticmethod):
            raise TypeError(f"{cls.__name__}.{name} is not a static method")
        if not getattr(method.__func__, _MARK, False):
            setattr(cls, name, staticmethod(accepts_paths(method.__func__)))
    return cls
