"""Settings for the whole test session."""

# transformers' progress bars (tqdm) start a monitor thread that outlives them. With a second Python thread alive,
# shardwise.forked.worker_count keeps work in one process (a fork would copy that thread mid-step), so every test
# after the first transformers load would take the one-process path of the search and of the published-run
# benchmarks instead of the forked one a user's `shardwise plan` takes. Bars still draw without the monitor.
try:
    import tqdm
except ImportError:  # no transformers, no bars
    pass
else:
    tqdm.tqdm.monitor_interval = 0
