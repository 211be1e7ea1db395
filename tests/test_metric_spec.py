"""seqvae/metric_spec.py: every metric one entry. EvalMetrics' keys and the spec agree both ways,
and a metric declared there (plus the code that computes it) reaches metrics.json, per_text.csv,
`seqvae compare` (table, CSV, JSON, differences), the bar chart and TensorBoard's HPARAMS tab."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from seqvae import metric_spec
from seqvae.analysis import compare, plots
from seqvae.core.metrics import EvalMetrics
from seqvae.metric_spec import SPEC, TEST, Metric
from seqvae.rundir import results
from seqvae.rundir.run_dir_callbacks import PerTextRows


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def feed(m: EvalMetrics, rec: list[float], seed: int = 0, ais: bool = False) -> None:
    """One update of len(rec) texts with every optional input given (posterior, IW-NLL, its s.e.; AIS's
    estimates where `ais`)."""
    n, g = len(rec), gen(seed)
    ais_out = {"nll": torch.tensor(rec) - 0.5, "se": torch.full((n,), 0.25), "accept": torch.full((n,), 0.7), "seconds": 1.0}
    m.update(
        torch.tensor(rec), torch.tensor([0.5] * n), torch.tensor([4] * n), mu=torch.randn(n, 2, generator=g),
        logvar=torch.randn(n, 2, generator=g) * 0.1, features=torch.randn(n, 3, generator=g),
        iw_nll=torch.tensor(rec) - 0.25, mi_generator=g, index=torch.arange(n), iw_se=torch.full((n,), 0.125),
        ais=ais_out if ais else None,
    )  # fmt: skip


def test_eval_metrics_keys_and_the_spec_agree():
    """Every key EvalMetrics computes (given every input) is declared, and every declared test/ key is
    computed; the same for its per-text columns and per_text.csv's."""
    # AIS: model.ais; text_columns: a KL penalty's per-text estimates (DualKL's NLL-bar)
    m = EvalMetrics(latent_dim=2, feature_dim=3, mi_dataset=True, per_text=True, ais=True, text_columns=("nll_bar",))
    feed(m, [10.0, 20.0, 30.0, 40.0], ais=True)
    m.update_text_columns({"nll_bar": torch.tensor([9.0, 19.0, 29.0, 39.0])}, 4)
    declared = {s.key for s in SPEC if s.key.startswith(TEST) and not s.logged}  # logged: a strategy's, at test
    assert {f"{TEST}{k}" for k in m.compute()} == declared
    rows = set(m.per_text_rows()) - {"index", "tokens"}  # which text, and its predicted tokens
    assert rows == {s.per_text for s in SPEC if s.per_text}
    assert set(metric_spec.per_text_columns()) == rows | set(metric_spec.PER_TEXT_LEAD)


def test_a_spec_with_an_id_twice_or_an_se_of_nothing_is_refused():
    twice = [*SPEC, Metric("kl", "test/kl2", "KL again", 2)]
    with pytest.raises(ValueError, match="id kl declared twice"):
        metric_spec.check(twice)
    with pytest.raises(ValueError, match="mc_se nll_se names no metric"):
        metric_spec.check([*SPEC, Metric("nll", "test/nll", "NLL", 2, mc_se="nll_se")])


# ---------------------------------------------------------------- a new metric, end to end

TOY_NLL = Metric("toy_nll", "test/toy_nll", "toy NLL", 2, differenced=True, per_text="toy_nll", text_mean=True,
                 hparam=True, bar=True)  # fmt: skip


@pytest.fixture
def toy_nll():
    """TOY_NLL declared for the test's length, as its one entry in SPEC."""
    SPEC.append(TOY_NLL)
    try:
        metric_spec.check(SPEC)
        yield TOY_NLL
    finally:
        SPEC.remove(TOY_NLL)


class WithToyNll(EvalMetrics):
    """EvalMetrics with the code of one more metric, per text and over the set (stand-in values:
    each text's reconstruction + 1)."""

    PER_TEXT = (*EvalMetrics.PER_TEXT, "toy_nll")

    def update(self, rec, kl, n_tokens, **kwargs):
        super().update(rec, kl, n_tokens, **kwargs)
        self.text_toy_nll.append(rec.detach().double() + 1)

    def compute(self):
        return {**super().compute(), "toy_nll": (self.rec / self.n + 1).float()}


def run_tested(tmp_path: Path, name: str, rec: list[float], latent_dim: int, monkeypatch) -> Path:
    """A run directory as `seqvae test` leaves it: config.yaml, then metrics.json, per_text.csv and
    the HPARAMS records written by write_test_results from a tested WithToyNll."""
    run = tmp_path / name / "seed1"
    run.mkdir(parents=True)
    config = {"seed_everything": 1, "model": {"latent_dim": latent_dim}, "data": {"seed": 1}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    m = WithToyNll(latent_dim=2, feature_dim=3, mi_dataset=True, per_text=True)
    feed(m, rec)
    rows, logged = m.per_text_rows(), {f"{TEST}{k}": v for k, v in m.compute().items()}
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(run))
    per_text = PerTextRows()
    per_text.rows = rows  # what the callback keeps from a test's metric object
    trainer = SimpleNamespace(log_dir=str(run), is_global_zero=True, callback_metrics=logged,
                              logger=SimpleNamespace(experiment=writer), callbacks=[per_text])  # fmt: skip
    model = SimpleNamespace(num_updates=10, hparams=SimpleNamespace(test_iw_samples=5, eval_seed=0), aggressive=None,
                            run_flags=dict)  # fmt: skip
    test = SimpleNamespace(line_numbers=list(range(1, len(rec) + 1)), labels=None)
    data = SimpleNamespace(summary=lambda: {"test": {"sha256": "same texts"}}, hparams=SimpleNamespace(seed=1),
                           corpora={"test": test})  # fmt: skip
    monkeypatch.setattr(results, "run_hparams", lambda model, seed: {"latent_dim": latent_dim})
    results.write_test_results(trainer, model, data, 1, ["test"], {})
    writer.close()
    return run


def hparams_metrics(run: Path) -> list[str]:
    """The metric names of the run's HPARAMS experiment record."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    names = []
    for path in sorted(run.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "hparams":
                    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    names += [info.name.tag for info in data.experiment.metric_infos]
    return names


def run_compare(capsys, *args) -> tuple[int, str, str]:
    rc = compare.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_metric_added_to_the_spec_reaches_all_five_outputs(toy_nll, tmp_path, capsys, monkeypatch):
    base = run_tested(tmp_path, "base", [10.0, 20.0, 30.0, 40.0], 4, monkeypatch)
    run = run_tested(tmp_path, "wider", [12.0, 21.0, 33.0, 40.0], 8, monkeypatch)
    assert "not declared" not in capsys.readouterr().err
    # 1. metrics.json
    assert json.loads((run / "metrics.json").read_text())["test/toy_nll"] == pytest.approx(27.5)
    # 2. per_text.csv: after the columns the first runs wrote
    with open(run / "per_text.csv", newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == ["index", "line", "tokens", "neg_elbo", "kl", "iw_nll", "iw_se", "toy_nll"]
    assert [float(r[-1]) for r in table[1:]] == [13.0, 22.0, 34.0, 41.0]
    # 3. compare: table, CSV, JSON and the difference to a baseline (paired by text, as declared)
    rc, out, _ = run_compare(capsys, base, run, "--label", "dir")
    assert rc == 0
    header, _, *lines = [[c.strip() for c in line.split("|")] for line in out.splitlines()[:4]]
    assert [cells[header.index("toy NLL")] for cells in lines] == ["26.00", "27.50"]
    rc, out, _ = run_compare(capsys, base, run, "--label", "dir", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [float(r["toy_nll_mean"]) for r in rows] == [26.0, 27.5]
    rc, out, _ = run_compare(capsys, run, "--baseline", base, "--label", "dir", "--format", "json")
    row = json.loads(out)["rows"][1]
    assert row["toy_nll"]["mean"] == 27.5
    assert {k: row["difference"]["toy_nll"][k] for k in ("diff", "n", "by")} == {"diff": 1.5, "n": 4, "by": "text"}
    rc, out, _ = run_compare(capsys, run, "--baseline", base, "--label", "dir")
    assert "| toy NLL |" in out and "+1.50 [" in out
    # 4. the bar chart's panels
    groups = compare.group_runs(compare.find_runs([str(base), str(run)]), "dir")
    fig = plots.bar_figure(groups)
    assert [ax.get_title() for ax in fig.axes] == ["IW-NLL", "KL", "MI(dataset)", "AU", "feature cos", "toy NLL"]
    # 5. TensorBoard's HPARAMS metrics
    assert hparams_metrics(run) == [s.key for s in SPEC if s.hparam]
    assert hparams_metrics(run)[-1] == "test/toy_nll"


def test_an_undeclared_test_metric_is_written_and_named(tmp_path, capsys, monkeypatch):
    """Computed but not in the spec: metrics.json keeps it, and one line says what will not show it."""
    run = run_tested(tmp_path, "base", [10.0, 20.0], 4, monkeypatch)
    assert json.loads((run / "metrics.json").read_text())["test/toy_nll"] == pytest.approx(16.0)
    err = capsys.readouterr().err
    assert ("seqvae: warning: test/toy_nll not declared in seqvae/metric_spec.py: in metrics.json, but compare, its plots "
            "and TensorBoard's HPARAMS do not show them\n") in err  # fmt: skip


def test_sweep_status_shows_the_specs_headline_metric(tmp_path, monkeypatch):
    """`seqvae sweep --status` reads a finished cell's metric from the spec's `headline` entries
    (IW-NLL, else −ELBO), first in SPEC's order; a headline added to the spec is the one shown."""
    from seqvae.experiments.grid import Cell
    from seqvae.experiments.status import cell_status

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cell = Cell(1, 1, "v", 1, run_dir, [])

    def shown(values: dict) -> str:
        (run_dir / "metrics.json").write_text(json.dumps({"epochs": 2, **values}))
        return cell_status(cell)["metric"]

    assert shown({"test/loss": 105.0, "test/iw_nll": 101.23456}) == "test/iw_nll 101.235"
    assert shown({"test/loss": 105.0, "test/iw_nll": None}) == "test/loss 105.000"  # tested without IW samples
    assert shown({"test/kl": 3.0}) == ""
    monkeypatch.setattr(metric_spec, "SPEC", [Metric("ppl", "test/iw_ppl", "PPL", 1, headline=True), *SPEC])
    assert shown({"test/loss": 105.0, "test/iw_nll": 101.0, "test/iw_ppl": 80.0}) == "test/iw_ppl 80.000"
