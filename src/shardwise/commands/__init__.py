"""Sub-commands of the `shardwise` CLI, one module each (see shardwise.cli)."""
