"""Hugging Face model folders in and out.

    mapping.py   the one name/layout mapping (Llama, GPT-2; Mixtral is one more table)
    load.py      check a folder whole before any process starts; each rank reads only its slices
    save.py      a shardwise checkpoint -> config.json + sharded safetensors + index, for `transformers`
"""
