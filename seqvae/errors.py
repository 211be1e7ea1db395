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
