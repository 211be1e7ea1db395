"""Row labels of `seqvae compare`: where a row's config departs from the settings most rows share
(`pooling=max`), a strategy named once with its arguments (`kl_penalty=FreeBits(target=8)`), the
LM as `LM`; or, with `--label dir`, the run directories' names, told apart where they clash.
"""

from __future__ import annotations

import json
import re

from seqvae.analysis.runs import MISSING, UNKNOWN_TRAINING

COMMON_LABEL = "common settings"
# What only a latent variable uses: an LM (`model.latent_dim: 0`) is labelled `LM`, not by the
# pooling, schedule or encoder it never ran (issue 45).
LM_UNUSED = (
    "model.latent_dim",
    "model.pooling",
    "model.kl_schedule",
    "model.kl_penalty",
    "model.regularizers",
    "model.skip",
    "model.bn_gamma",
    "model.bn_eps",
    "model.encoder",
    "model.encoder_hidden_dim",
    "model.feature_norm",
    "model.aggressive",
    "model.mi_dataset",
)
LM_LABEL = "LM"


def number(value) -> str:
    """8.0 -> 8, 0.1 -> 0.1: an argument as a person writes it."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return json.dumps(value) if value is None or isinstance(value, (bool, list, dict)) else str(value)


def show(key: str, value) -> str:
    if key.endswith("class_path") and isinstance(value, str):
        return value.rsplit(".", 1)[-1]
    return json.dumps(value) if value is None or isinstance(value, (bool, list, dict)) else str(value)


def strategies(flat: dict) -> dict:
    """The flat config with each strategy (`P.class_path` + `P.init_args.*`) folded into one key P
    whose value is `Class(arg=v, ...)`; a list of them (`regularizers.0`, `.1`) into its list's key,
    joined by ` + `. So a row with no penalty (`kl_penalty: null`) and one with FreeBits differ in one key."""
    out = dict(flat)
    folded: dict[str, dict[int, str]] = {}
    for key in sorted(k for k in flat if k.endswith(".class_path")):
        prefix = key[: -len(".class_path")]
        args = {k[len(prefix) + len(".init_args.") :]: v for k, v in flat.items() if k.startswith(prefix + ".init_args.")}
        for k in [k for k in out if k == prefix or k.startswith(prefix + ".")]:
            del out[k]
        name = show(key, flat[key]) + "(" + ", ".join(f"{a}={number(v)}" for a, v in args.items() if v is not None) + ")"
        m = re.fullmatch(r"(.+)\.(\d+)", prefix)
        parent, index = (m.group(1), int(m.group(2))) if m else (prefix, 0)
        folded.setdefault(parent, {})[index] = name
    for parent, items in folded.items():
        out[parent] = " + ".join(items[i] for i in sorted(items))
    return out


def label_config(config: dict) -> dict:
    """What a row's label is made of: strategies folded; an LM's unused latent settings dropped."""
    out = strategies(config)
    if config.get("model.latent_dim") == 0:
        out = {k: v for k, v in out.items() if not any(k == p or k.startswith(p + ".") for p in LM_UNUSED)}
        out["model"] = LM_LABEL
    return out


def short_names(keys: list[str]) -> dict[str, str]:
    """Shortest dotted suffix (without class_path/init_args) that tells the varying keys apart."""
    parts = {k: [p for p in k.split(".") if p not in ("class_path", "init_args")] or [k] for k in keys}
    depth = {k: 2 if parts[k][-1].isdigit() else 1 for k in keys}
    while True:
        names = {k: ".".join(parts[k][-depth[k] :]) for k in keys}
        clash = [k for k in keys if list(names.values()).count(names[k]) > 1 and depth[k] < len(parts[k])]
        if not clash:
            return names
        for k in clash:
            depth[k] += 1


def varying_keys(groups: list[dict], field: str = "config") -> list[str]:
    keys = sorted({k for g in groups for k in g[field]})

    def values(k: str) -> set[str]:
        return {json.dumps(g[field].get(k, "<absent>"), default=str) for g in groups if not lm_lacks(g[field], k)}

    return [k for k in keys if len(values(k)) > 1]


def common_values(groups: list[dict], keys: list[str], field: str = "config") -> dict:
    """key -> the value more than half of the groups share, for the keys that have one. A label
    names only where its row departs from these (15 methods: `pooling=max`, not every key that
    varies somewhere); a key without a majority value (two rows) is named in every row."""
    out = {}
    for k in keys:
        having = [g for g in groups if not lm_lacks(g[field], k)]  # an LM has no say on latent settings
        values = [json.dumps(g[field].get(k, "<absent>"), sort_keys=True, default=str) for g in having]
        top = max(set(values), key=values.count) if values else '"<absent>"'
        if values.count(top) * 2 > len(having) and top != '"<absent>"':
            out[k] = json.loads(top)
    return out


def lm_lacks(config: dict, key: str) -> bool:
    """A label config that has no say on `key`: an LM's on a setting only a latent variable uses, a
    re-test's whose training run is not here on any but the model's (its checkpoint's) settings."""
    if key in config:
        return False
    if config.get(UNKNOWN_TRAINING) and not key.startswith("model."):
        return True
    return config.get("model") == LM_LABEL and any(key == p or key.startswith(p + ".") for p in LM_UNUSED)


def item(name: str, key: str, value) -> str:
    if key == UNKNOWN_TRAINING:
        return key if value is True else f"not {key}"
    return LM_LABEL if key == "model" and value == LM_LABEL else f"{name}={show(key, value)}"


def config_label(config: dict, varying: list[str], common: dict, names: dict) -> str:
    """Where a row departs from the common settings. A key the row lacks is named too (`key=–`)
    when most rows set it, or the row would read as "common settings" while differing from them;
    not an LM's latent settings (it has none: `LM` says so)."""
    shown = [
        k
        for k in varying
        if ((k in common and config.get(k, MISSING) != common[k]) or (k not in common and k in config))
        and not lm_lacks(config, k)
    ]
    return ", ".join(item(names[k], k, config.get(k, MISSING)) for k in sorted(shown, key=lambda k: k != "model"))


def config_labels(groups: list[dict]) -> None:
    """Sets g["label"] of every group from its config (`label_config`)."""
    for g in groups:
        g["label_config"] = label_config(g["config"])
    varying = varying_keys(groups, "label_config")
    names = short_names(varying)
    common = common_values(groups, varying, "label_config")
    for g in groups:
        g["label"] = config_label(g["label_config"], varying, common, names) or COMMON_LABEL


def dir_label(group: dict, depth: int) -> str:
    """The variant directories of a group's runs (`last`), with `depth` - 1 directories above them."""
    names = ("/".join(r["path"].resolve().parent.parts[-depth:]) for r in group["runs"])
    return ",".join(dict.fromkeys(names))


def unique_dir_labels(groups: list[dict]) -> None:
    """Two configs in directories of one name (`recipe20/last`, `encoder_width/last`) would share a
    row label: such rows take the directories above theirs until the labels differ. Configs in one
    directory (`runs/kscan/version_0..3`, one K each) are told apart by where their configs differ."""
    by_label: dict[str, list[dict]] = {}
    for g in groups:
        by_label.setdefault(g["label"], []).append(g)
    for label, clash in by_label.items():
        if len(clash) > 1 and len({dir_label(g, 99) for g in clash}) == 1:  # the same directory: no depth helps
            for g in clash:
                g["label_config"] = label_config(g["config"])
            varying = varying_keys(clash, "label_config")
            names = short_names(varying)
            for g in clash:
                g["label"] = f"{label}: {config_label(g['label_config'], varying, {}, names)}"
    for depth in range(2, 6):
        seen = [g["label"] for g in groups]
        clash = [g for g in groups if seen.count(g["label"]) > 1]
        if not clash:
            return
        for g in clash:
            g["label"] = dir_label(g, depth)


def common_settings_note(groups: list[dict], label_by: str) -> list[str]:
    """The footnote that says what the labels leave out: the shared values of the keys that vary."""
    if label_by == "dir" or len(groups) < 3:
        return []
    configs = [{"label_config": label_config(g["config"])} for g in groups]
    varying = varying_keys(configs, "label_config")
    common = common_values(configs, varying, "label_config")
    if not common:
        return []
    names = short_names(varying)
    shared = ", ".join(item(names[k], k, v) for k, v in common.items())
    return [f"Rows are labelled by where they differ from the settings most rows share ({COMMON_LABEL}): {shared}"]
