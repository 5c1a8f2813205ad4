"""Regenerate megatron_lm_arguments.json: every option of Megatron-LM's argument parser.

    git clone https://github.com/NVIDIA/Megatron-LM && cd Megatron-LM && git checkout COMMIT
    PYTHONPATH=$PWD python /path/to/extract_megatron_arguments.py COMMIT > megatron_lm_arguments.json

Needs torch and Megatron-LM's Python dependencies (not Transformer Engine or a GPU; triton must be
importable). Reads `megatron.training.arguments.add_megatron_arguments` — the parser `pretrain_gpt.py`
uses — and writes, per option, its flags, destination, action kind, type, choices and constant: what
tests/test_emit.py needs to parse the arguments shardwise emits the way Megatron-LM does.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing

typing.override = getattr(typing, "override", lambda f: f)  # Python < 3.12


KINDS = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
         "_StoreConstAction": "store_const", "_AppendAction": "append", "BooleanOptionalAction": "boolean_optional"}


def _plain(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def main() -> int:
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    options = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        options.append({
            "flags": action.option_strings, "dest": action.dest,
            "action": KINDS.get(type(action).__name__, type(action).__name__),
            "type": getattr(action.type, "__name__", None) if action.type else None,
            "nargs": action.nargs, "const": _plain(action.const),
            "choices": [_plain(c) for c in action.choices] if action.choices else None,
        })
    head = {"source": f"https://github.com/NVIDIA/Megatron-LM/blob/{sys.argv[1]}/megatron/training/arguments.py",
            "commit": sys.argv[1]}
    lines = ",\n".join(json.dumps(o) for o in options)  # one option per line: readable diffs
    sys.stdout.write(json.dumps(head)[:-1] + ', "options": [\n' + lines + "\n]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
