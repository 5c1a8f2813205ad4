"""Frozen dataclasses the planner makes and looks up by the ten thousand per search: a hash kept once computed,
and a copy with some fields changed that skips the frozen __init__.

A Job's hash, taken afresh, walks every field of the model, the cluster and the training spec (2.5 µs each time);
dataclasses.replace re-runs __init__, which sets each field through object.__setattr__ (7 µs for a Layout).
"""

from __future__ import annotations

from dataclasses import fields, replace

_KEY = "_shardwise_hash"


def cached_hash(cls):
    """Class decorator for a frozen dataclass: its generated __hash__ runs once per instance and the value is
    kept on it (the fields cannot change). Left out of a pickle: a string's hash differs between processes."""
    compute = cls.__hash__

    def __hash__(self):
        try:
            return self.__dict__[_KEY]
        except KeyError:
            value = self.__dict__[_KEY] = compute(self)
            return value

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != _KEY}

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    return cls


def replaced(obj, changes: dict):
    """dataclasses.replace(obj, **changes) for a frozen dataclass without __post_init__: the fields copied, then
    `changes` (an unknown name still raises, as replace does); a hash kept on `obj` (cached_hash) is not carried
    over, since the copy's fields differ."""
    cls = type(obj)
    names = cls.__dict__.get("_field_names")
    if names is None:
        names = frozenset(f.name for f in fields(cls))
        setattr(cls, "_field_names", names)
    if not changes.keys() <= names:
        return replace(obj, **changes)
    new = object.__new__(cls)
    state = new.__dict__
    state.update(obj.__dict__)
    state.pop(_KEY, None)
    state.update(changes)
    return new
