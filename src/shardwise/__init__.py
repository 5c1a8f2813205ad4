"""shardwise: where to split a training job (DP, TP, PP, CP, EP), how to run that split, and proof it is right."""

__version__ = "0.1.0"
