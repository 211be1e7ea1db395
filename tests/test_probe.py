"""`seqvae probe` (issue 39, item 2): the logistic-regression probe on constructed means (separable:
accuracy 1; label-independent: the majority rate within the accuracy's interval), and end to end on
a tiny labelled corpus: probe.json written, metrics.json keeps its keys and gains probe/ ones,
no overwrite without --force, bad input one line and nothing written, a language model refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from test_scoring import TINY, run

from seqvae.analysis.probe import majority_rate, probe_accuracies


def test_separable_means_are_probed_with_accuracy_one():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[6.0, 0, 0, 0], [0, 6.0, 0, 0], [0, 0, 6.0, 0]])
    y_train, y_test = torch.arange(300) % 3, torch.arange(90) % 3
    x_train = centres[y_train] + 0.3 * torch.randn(300, 4, generator=g)
    x_test = centres[y_test] + 0.3 * torch.randn(90, 4, generator=g)
    result = probe_accuracies(x_train, y_train, x_test, y_test, [10, 100], draws=3, seed=0)
    for r in result["sizes"].values():
        assert r["accuracies"] == [1.0, 1.0, 1.0] and r["mean"] == 1.0
    assert result["majority"] == pytest.approx(1 / 3)
    # standardised: means that vary by a thousandth (a near-collapsed encoder's) are probed alike
    small = probe_accuracies(1e-3 * x_train, y_train, 1e-3 * x_test, y_test, [100], draws=2, seed=0)
    assert small["sizes"][100]["accuracies"] == [1.0, 1.0]


def test_label_independent_means_score_the_majority_rate_within_the_interval():
    g = torch.Generator().manual_seed(1)
    y_train = (torch.rand(2000, generator=g) < 0.2).long()  # 80% class 0, independent of x
    y_test = (torch.rand(500, generator=g) < 0.2).long()
    x_train, x_test = torch.randn(2000, 8, generator=g), torch.randn(500, 8, generator=g)
    result = probe_accuracies(x_train, y_train, x_test, y_test, [100, 1000], draws=5, seed=3)
    label, rate = majority_rate(y_test)
    assert label == 0 and result["majority"] == rate and 0.75 < rate < 0.85
    for r in result["sizes"].values():
        assert r["lo"] - 1e-9 <= rate <= r["hi"] + 1e-9, r
        assert abs(r["mean"] - rate) < 0.03, r


def test_the_subsets_are_seeded_and_a_sizes_draws_do_not_depend_on_the_others():
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(400, 3, generator=g), torch.randint(0, 3, (400,), generator=g)
    x[:, 0] += y  # a little signal
    a = probe_accuracies(x[:300], y[:300], x[300:], y[300:], [20, 50], draws=3, seed=5)
    b = probe_accuracies(x[:300], y[:300], x[300:], y[300:], [50], draws=3, seed=5)
    c = probe_accuracies(x[:300], y[:300], x[300:], y[300:], [50], draws=3, seed=6)
    assert a["sizes"][50]["accuracies"] == b["sizes"][50]["accuracies"] != c["sizes"][50]["accuracies"]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A tiny VAE and a tiny LM fitted on a labelled corpus whose label shows in the text."""
    root = tmp_path_factory.mktemp("probe")
    corpus = root / "yelp.txt"
    words = ["bad awful", "poor meh", "fine okay", "good nice", "great superb"]
    corpus.write_text("".join(f"{i % 5} the food was {words[i % 5]} w{i} end\n" for i in range(1, 81)))
    common = [f"--data.train={corpus}#1-50", f"--data.val={corpus}#51-60", f"--data.test={corpus}#61-80",
              "--data.label_column=first_token", "--model.test_iw_samples=2", "--trainer.max_epochs=1",
              f"--trainer.logger.init_args.save_dir={root}", *TINY]  # fmt: skip
    return root, corpus, common


def fit(fitted, capsys, version: str, *extra) -> object:
    root, _, common = fitted
    if not (root / "default" / version / "metrics.json").is_file():
        status, err = run(["fit", *common, *extra, f"--trainer.logger.init_args.version={version}"], capsys)
        assert status == 0, err
    return root / "default" / version


def test_probe_writes_probe_json_and_adds_its_keys_to_metrics_json(fitted, capsys):
    run_dir = fit(fitted, capsys, "vae")
    before = json.loads((run_dir / "metrics.json").read_text())
    status, err = run(["probe", run_dir, "--sizes", "10,30", "--draws", "3"], capsys)
    assert status == 0, err
    probe = json.loads((run_dir / "probe.json").read_text())
    assert probe["train"]["split"].endswith("#1-50") and probe["test"]["split"].endswith("#61-80")
    assert probe["train"]["texts"] == 50 and probe["test"]["texts"] == 20 and probe["classes"] == list("01234")
    assert set(probe["sizes"]) == {"10", "30"} and len(probe["sizes"]["30"]["accuracies"]) == 3
    assert probe["majority"] == pytest.approx(0.2)
    after = json.loads((run_dir / "metrics.json").read_text())
    assert {k: v for k, v in after.items() if not k.startswith("probe/")} == before
    assert after["probe/acc_n30"] == pytest.approx(probe["sizes"]["30"]["mean"]) and after["probe/majority"] == probe["majority"]
    assert set(after) - set(before) == {"probe/acc_n10", "probe/acc_n30", "probe/majority"}
    # not again without --force; with it, the probe/ keys are replaced (none from the earlier sizes left)
    status, err = run(["probe", run_dir, "--sizes", "10"], capsys)
    assert status == 2 and "probe.json: exists" in err and "--force" in err
    assert json.loads((run_dir / "metrics.json").read_text()) == after
    status, err = run(["probe", run_dir, "--sizes", "20", "--draws", "2", "--force"], capsys)
    assert status == 0, err
    again = json.loads((run_dir / "metrics.json").read_text())
    assert set(again) - set(before) == {"probe/acc_n20", "probe/majority"}
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == []  # no temporary file left


@pytest.mark.parametrize("args, says", [
    (["--test", "missing.txt#1-5"], "--test: missing.txt: no such file"),
    (["--train", "{corpus}#61-70"], "shares lines 61-70 with --train"),
    (["--sizes", "10,500,600"], "--sizes: 500, 600 labelled texts asked for"),  # each at once, not one per retry
    (["--label-column", "tab"], "--train: "),  # no line has a tab: no labels
    (["--threads", "0"], "--threads: must be >= 1, got 0"),  # was taken as 1, silently
])  # fmt: skip
def test_bad_input_is_one_line_naming_the_option_and_nothing_is_written(fitted, capsys, args, says):
    run_dir = fit(fitted, capsys, "vae")

    def files():
        return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}

    before = files()
    # --force: the refusal to overwrite an earlier probe is not what stops these
    status, err = run(["probe", run_dir, "--force", *(a.format(corpus=fitted[1]) for a in args)], capsys)
    lines = [x for x in err.splitlines() if x.startswith("seqvae probe: error:")]
    assert status == 2 and len(lines) == 1 and says in lines[0], err
    assert files() == before


def test_an_unknown_option_is_refused(fitted, capsys):
    status, err = run(["probe", fitted[0], "--bogus", "10"], capsys)
    assert status == 2 and "unrecognized arguments: --bogus 10" in err


def test_a_language_model_has_no_z_and_is_refused_in_one_line(fitted, capsys):
    run_dir = fit(fitted, capsys, "lm", "--model.latent_dim=0")
    before = (run_dir / "metrics.json").read_bytes()
    status, err = run(["probe", run_dir], capsys)
    assert status == 2 and err.strip().count("\n") == 0 and "a language model (latent_dim 0) has no z to probe" in err, err
    assert not (run_dir / "probe.json").exists() and (run_dir / "metrics.json").read_bytes() == before


def test_probe_help_starts_without_torch():
    code = (
        "import sys\nfrom seqvae.commands import main\n"
        "try:\n    main(['probe', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'pytorch_lightning', 'tokenizers') if m in sys.modules]\n"
        "sys.exit(f'loaded {heavy}' if heavy else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "usage: seqvae probe" in result.stdout, result.stderr[-2000:] + result.stdout


def test_an_accuracy_interval_stays_within_0_and_1():
    from seqvae.analysis.probe import interval

    wide = interval([0.5, 1.0])  # two draws: t(0.975, 1) = 12.706 reaches far past 1 and below 0
    assert (wide["mean"], wide["lo"], wide["hi"]) == (0.75, 0.0, 1.0)
    narrow = interval([0.5, 0.6, 0.7])
    half = 4.302653 * 0.1 / 3**0.5  # t(0.975, 2) · s.d. / √n: inside [0, 1], not cut
    assert narrow["lo"] == pytest.approx(0.6 - half) and narrow["hi"] == pytest.approx(0.6 + half)
