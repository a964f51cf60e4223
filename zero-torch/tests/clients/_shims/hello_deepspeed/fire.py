"""Stand-in for python-fire's ``fire.Fire`` (not installed in the test environment), for
``train_bert_ds.py``'s last line ``fire.Fire(train)``: each ``--name value`` (or
``--name=value``, or a bare ``--flag`` meaning True) becomes the keyword ``name`` of the
call, its value parsed as a Python literal where it is one (Fire's rule), else a string.
Fire prints what the function returns; so does this. Only appended to ``sys.path`` by the
client suite's bootstrap, so an installed ``fire`` wins."""

import ast
import inspect
import sys


def _value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def Fire(component=None, command=None, name=None, serialize=None):
    argv = list(sys.argv[1:]) if command is None else (command.split() if isinstance(command, str) else list(command))
    params = inspect.signature(component).parameters
    kwargs = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise SystemExit(f"fire stand-in: positional argument {arg!r} is not supported")
        key, eq, text = arg[2:].partition("=")
        if not eq:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                text = argv[i + 1]
                i += 1
            else:
                text = "True"
        key = key.replace("-", "_")
        if key not in params:
            raise SystemExit(f"fire stand-in: {component.__name__}() has no argument {key!r}")
        kwargs[key] = _value(text)
        i += 1
    result = component(**kwargs)
    if result is not None:
        print(result)
    return result
