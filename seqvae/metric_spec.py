"""Every metric a run records, declared once: its metrics.json key, its header and digits in
`seqvae compare`, and which outputs show it. metrics.json, per_text.csv, compare (table, JSON,
CSV, differences to a baseline), compare's bar chart and TensorBoard's HPARAMS tab all read
`SPEC`; adding a metric is one entry here plus the code that computes it (docs/architecture.md,
"Adding a variant"; tests/test_metric_spec.py holds EvalMetrics and this list to each other).
Torch-free and importing nothing of seqvae, so every room may read it.
"""

from __future__ import annotations

from dataclasses import dataclass

TEST = "test/"  # EvalMetrics.compute()'s values at test are logged, and kept in metrics.json, as test/<name>


@dataclass(frozen=True)
class Metric:
    """One metric. `id`: its name in compare's CSV and JSON; `key`: in metrics.json (`test/<name>`
    for EvalMetrics' own); `header`: compare's column and the bar chart's panel title; `digits`:
    decimals shown."""

    id: str
    key: str
    header: str
    digits: int
    compared: bool = True  # a column of compare's table, CSV and JSON (False: in metrics.json only)
    differenced: bool = False  # gets a difference to `compare --baseline` with a 95% interval
    per_text: str | None = None  # its column in per_text.csv (EvalMetrics.per_text_rows' name)
    text_mean: bool = False  # a mean over test texts: not differenced between runs tested on other texts
    k_biased: bool = False  # its finite-K bias depends on the model: not differenced across K importance samples
    count: bool = False  # counts units: a difference of whole units is shown without decimals
    bn_sensitive: bool = False  # reads the posterior (BN-VAE's means, WAE-RNF's heads): † where a check broke
    hparam: bool = False  # one of the run's metrics in TensorBoard's HPARAMS tab
    bar: bool = False  # a panel of `compare --plots`' bar chart of final test metrics
    bar_zoom: bool = False  # that panel's axis spans the values, not 0 (differences of a few nats in ~400)
    mc_se: str | None = None  # the id of the metric holding this one's Monte-Carlo standard error
    # False: only runs a later command measured (`seqvae probe`); its difference column shows where a row has it
    every_run: bool = True
    divide_by: float = 1  # compare shows the recorded value divided by this (fit_seconds as minutes)
    logged: bool = False  # logged at test by a strategy (a KL penalty's own estimates), not computed by EvalMetrics
    headline: bool = False  # `seqvae sweep --status` shows a finished run's first headline metric (`headline`)


# compare's column order. rec, elbo_ppl and the μ spectrum's EV are in metrics.json only: compare's
# table was already wide when they were added.
SPEC: list[Metric] = [
    Metric(
        "iw_nll",
        "test/iw_nll",
        "IW-NLL",
        2,
        differenced=True,
        per_text="iw_nll",
        text_mean=True,
        k_biased=True,
        bn_sensitive=True,
        hparam=True,
        bar=True,
        bar_zoom=True,
        mc_se="iw_nll_se",
        headline=True,
    ),
    # a run's own: √(Σ se_i²)/N over its texts' per-text s.e. (a row shows its runs' root mean square)
    Metric("iw_nll_se", "test/iw_nll_se", "IW-NLL MC se", 2, per_text="iw_se"),
    # AIS (SPEC §14; a test with `model.ais` only): an upper bound on the NLL in expectation, like IW-NLL;
    # its s.e. is the delta method's across chains
    Metric(
        "ais_nll",
        "test/ais_nll",
        "AIS-NLL",
        2,
        differenced=True,
        per_text="ais_nll",
        text_mean=True,
        every_run=False,
        mc_se="ais_nll_se",
    ),
    Metric("ais_nll_se", "test/ais_nll_se", "AIS-NLL MC se", 2, per_text="ais_se", every_run=False),
    Metric("ais_ppl", "test/ais_ppl", "AIS PPL", 1, compared=False),
    Metric("ais_accept", "test/ais_accept", "AIS HMC acceptance", 3, compared=False),
    Metric("ais_seconds_per_text", "test/ais_seconds_per_text", "AIS s/text", 2, compared=False),
    # iVAE's reference estimates (DualKL.test_batch, SPEC §11.5; a run with model.kl_penalty DualKL only):
    # NLL-bar = reconstruction over 128 posterior draws + the critic's NWJ dual KL, which is not an NLL
    Metric("nll_bar", "test/nll_bar", "NLL-bar", 2, every_run=False, logged=True, per_text="nll_bar"),
    Metric("rec_bar", "test/rec_bar", "rec-bar", 2, compared=False, logged=True),
    Metric("dual_kl", "test/dual_kl", "dual KL", 2, every_run=False, logged=True),
    Metric("dual_kl_z", "test/dual_kl_z", "dual KL(z)", 2, compared=False, logged=True),
    Metric("dual_mi", "test/dual_mi", "dual MI", 2, compared=False, logged=True),
    Metric("sigma_min_L", "test/sigma_min_L", "σ_min(L)", 4, compared=False, logged=True),  # FullCovGaussianPosterior's L
    Metric(
        "neg_elbo",
        "test/loss",
        "−ELBO",
        2,
        differenced=True,
        per_text="neg_elbo",
        text_mean=True,
        bn_sensitive=True,
        hparam=True,
        headline=True,  # the language model's, and a run tested without importance samples
    ),
    Metric("rec", "test/rec", "reconstruction", 2, compared=False, bn_sensitive=True),
    Metric("kl", "test/kl", "KL", 2, differenced=True, per_text="kl", text_mean=True, bn_sensitive=True, hparam=True, bar=True),
    Metric("mi", "test/mi", "MI", 2, differenced=True, bn_sensitive=True, hparam=True),
    Metric(
        "mi_dataset",
        "test/mi_dataset",
        "MI(dataset)",
        2,
        differenced=True,
        bn_sensitive=True,
        hparam=True,
        bar=True,
        mc_se="mi_dataset_se",
    ),
    Metric("mi_dataset_se", "test/mi_dataset_se", "MI(dataset) MC se", 3),
    Metric("au", "test/au", "AU", 1, differenced=True, count=True, bn_sensitive=True, hparam=True, bar=True),
    Metric("feature_cos", "test/feature_cos", "feature cos", 4, hparam=True, bar=True),
    Metric("feature_ev1", "test/feature_ev1", "feature EV1", 3),
    Metric("feature_ev3", "test/feature_ev3", "feature EV3", 3),
    Metric("feature_erank", "test/feature_erank", "feature erank", 1),
    Metric("mu_ev1", "test/mu_ev1", "μ EV1", 3, compared=False, bn_sensitive=True),
    Metric("mu_ev3", "test/mu_ev3", "μ EV3", 3, compared=False, bn_sensitive=True),
    Metric("mu_erank", "test/mu_erank", "μ erank", 1, bn_sensitive=True),
    Metric("iw_ppl", "test/iw_ppl", "PPL", 1, differenced=True, text_mean=True, k_biased=True, bn_sensitive=True),
    Metric("elbo_ppl", "test/elbo_ppl", "ELBO PPL", 1, compared=False, bn_sensitive=True),
    # `seqvae probe`: held-out accuracy of a label probe on the means, 2000 labelled texts, and the
    # majority class's (what a z that knows nothing of the label scores)
    Metric("probe_acc", "probe/acc_n2000", "probe acc", 3, differenced=True, every_run=False),
    Metric("probe_majority", "probe/majority", "majority", 3, every_run=False),
    Metric("encoder_updates", "encoder_updates", "enc updates", 0),
    Metric("decoder_updates", "decoder_updates", "dec updates", 0),
    Metric("train_minutes", "fit_seconds", "train minutes", 1, divide_by=60),
]

# per_text.csv: the columns before the metrics' (which text, its line in the test file, its
# predicted tokens); then the metric columns in the order the first runs wrote them (committed
# files and compare's messages keep it), then any newer per-text metric's, in SPEC's order.
PER_TEXT_LEAD = ("index", "line", "tokens")
PER_TEXT_FIRST = ("neg_elbo", "kl", "iw_nll", "iw_se")


def metric(mid: str) -> Metric:
    """The entry of id `mid`."""
    for m in SPEC:
        if m.id == mid:
            return m
    raise KeyError(mid)


def compared() -> list[Metric]:
    """compare's columns (table, CSV, JSON), in order."""
    return [m for m in SPEC if m.compared]


def differenced() -> list[Metric]:
    return [m for m in SPEC if m.compared and m.differenced]


def ids(flag: str) -> tuple[str, ...]:
    """The ids of compare's metrics with `flag` set (`ids("bn_sensitive")`)."""
    return tuple(m.id for m in compared() if getattr(m, flag))


def per_text_columns() -> tuple[str, ...]:
    """per_text.csv's columns without the label (which follows them where the test file has labels)."""
    named = [m.per_text for m in SPEC if m.per_text]
    first = [c for c in PER_TEXT_FIRST if c in named]
    return (*PER_TEXT_LEAD, *first, *(c for c in named if c not in first))


def headline(values: dict) -> tuple[str, float] | None:
    """The first headline metric (in SPEC's order) that a run's metrics.json `values` hold as a
    number: its key and value; None if none."""
    found = (m.key for m in SPEC if m.headline and isinstance(values.get(m.key), (int, float)))
    key = next(found, None)
    return None if key is None else (key, values[key])


def mc_se_keys() -> set[str]:
    """metrics.json keys that are a run's Monte-Carlo standard error of another metric."""
    return {metric(m.mc_se).key for m in SPEC if m.mc_se}


def undeclared(keys) -> list[str]:
    """The test/ keys among `keys` that no entry declares (compare, plots and HPARAMS would not show them)."""
    declared = {m.key for m in SPEC}
    return sorted(k for k in keys if k.startswith(TEST) and k not in declared)


def check(spec: list[Metric]) -> None:
    """Ids, keys and per-text columns each used once; an mc_se names an entry."""
    for field in ("id", "key", "per_text"):
        values = [getattr(m, field) for m in spec if getattr(m, field) is not None]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ValueError(f"metric_spec: {field} {', '.join(twice)} declared twice")
    unknown = [m.mc_se for m in spec if m.mc_se and m.mc_se not in {e.id for e in spec}]
    if unknown:
        raise ValueError(f"metric_spec: mc_se {', '.join(unknown)} names no metric")


check(SPEC)
