"""A hash computed once per frozen spec: the planner keys its caches on the job and its specs, and a search
looks them up tens of thousands of times (a Job's hash, taken afresh, walks every field of the model, the
cluster and the training spec: 2.5 µs each time)."""

from __future__ import annotations

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
