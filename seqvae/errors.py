"""The two kinds of error a user's input can raise; the CLI prints each as one line (rc 2)."""


class CorpusError(ValueError):
    """Bad input data; the message names the file (and line) and is printed as one line."""


class ConfigError(ValueError):
    """A combination of options this toolkit refuses; the message names the option."""


def union_choice_error(message: str) -> str | None:
    """jsonargparse's "Does not validate against any of the Union subtypes" dump (351 characters
    for `--data.label_column foo`) as one line naming the option and what it accepts; None for
    any other message."""
    import re

    found = re.search(
        r'Parser key "([\w.]+)": Does not validate against any of the Union subtypes Subtypes: \[(.*?)\] Errors:', message
    )
    if found is None:
        return None
    given = re.search(r"Given value: (.*)$", message)
    names = {"bool": "true, false", "NoneType": "null", "float": "a number", "int": "an integer", "str": "a string"}
    allowed = []
    for part in re.findall(r"<class '([\w.]+)'>|typing\.Literal\[([^\]]*)\]", found.group(2)):
        cls, literal = part
        allowed.append(", ".join(v.strip(" '\"") for v in literal.split(",")) if literal else names.get(cls, cls))
    got = f"; got {given.group(1).strip()!r}" if given else ""
    return f"{found.group(1)}: expected {' or '.join(allowed) if len(allowed) < 3 else ', '.join(allowed)}{got}"


def class_option_error(message: str) -> str | None:
    """jsonargparse's dump for a class given by class_path (`--model.kl_schedule seqvae.X`, or its
    `init_args` on the command line or in a --config file) as one line naming the option and what is
    wrong: the class that does not exist, the option the class does not have (with the nearest names),
    the value of the wrong type. Before, all three read "expected …KLSchedule or null; got
    NestedArg(…)", hiding which option was refused and why. None for any other message."""
    import re

    found = re.search(
        r"Parser key \"([\w.]+)\":.*?Problem with given class_path '([\w.]+)': (.*?)(?: - | Given value type:|$)",
        message,
    )
    if found is None:
        return None
    key, class_path, detail = found.groups()
    if detail.startswith('Parser key "') and "Does not validate against any of the Union subtypes" in detail:
        inner = class_option_error(message[found.start(3) :])  # a class inside the class (WAE-RNF's mmd)
        return f"{key}.init_args.{inner}" if inner else None
    if unknown := re.fullmatch(r"Option '([\w.]+)' is not accepted", detail.strip()):
        option = unknown.group(1)
        names = class_options(class_path)
        near = _nearest(option, names)
        hint = f"did you mean {near}?" if near else f"its options: {', '.join(names)}" if names else ""
        return f"{key}.init_args.{option}: {class_path} has no option '{option}'" + (f" ({hint})" if hint else "")
    if wrong := re.fullmatch(r"Parser key \"([\w.]+)\": Expected a <class '(\w+)'>\. Got value: (.*)", detail.strip()):
        option, kind, value = wrong.groups()
        kinds = {"float": "a number", "int": "an integer", "bool": "true or false", "str": "a string"}
        return f"{key}.init_args.{option}: expected {kinds.get(kind, kind)}; got {value!r} ({class_path})"
    if missing := re.fullmatch(r"module '([\w.]+)' has no attribute '(\w+)'", detail.strip()):
        module, name = missing.groups()
        near = _nearest(name, _public_names(module))
        base = re.search(r"Subtypes: \[<class '[\w.]*?(\w+)'>", message)
        wanted = f"a subclass of {base.group(1)}" if base else "a class"
        return f"{key}: no class {class_path}" + (f" (did you mean {module}.{near}?)" if near else f" ({wanted} is expected)")
    return f"{key}: {class_path}: {detail.strip()}"


def class_options(class_path: str) -> list[str]:
    """The keyword options a class's constructor takes (what `init_args` may set); [] if it is not importable."""
    import importlib
    import inspect

    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        params = inspect.signature(cls).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def unrecognized_option_hint(message: str, known: list[str]) -> str:
    """argparse's "unrecognized arguments: --model.hiden_dim 3" with the nearest known option added
    (for each unknown option that has one: `(did you mean --model.hidden_dim, --model.latent_dim?)`)."""
    import re

    _, _, given = message.partition("unrecognized arguments:")
    nearest = [_nearest(name, known) for name in re.findall(r"(?:^|\s)--([\w.]+)", given)]
    nearest = list(dict.fromkeys(f"--{near}" for near in nearest if near))
    return f"{message} (did you mean {', '.join(nearest)}?)" if nearest else message


def _public_names(module: str) -> list[str]:
    import importlib

    try:
        return [n for n in dir(importlib.import_module(module)) if not n.startswith("_")]
    except ImportError:
        return []


def _nearest(name: str, names: list[str]) -> str | None:
    import difflib

    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return close[0] if close else None
