"""shardwise: where to split a training job (DP x TP x PP), how to run that split, and proof it is right."""

__version__ = "0.1.0"
