"""Every shipped config parses, instantiates, and (for the yahoo10k variants) trains a few steps.

The corpus paths are overridden with a tiny generated corpus, so the real Yahoo/Yelp files are not
needed; everything else (model, schedules, penalties, aggressive training, callbacks) is the
config's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_model import write_corpus

from seqvae.cli import SeqVAECLI
from seqvae.text.corpus import CorpusError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
VARIANTS = sorted(p.stem for p in (CONFIGS / "yahoo10k").glob("*.yaml") if not p.stem.startswith("base"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for name, seed in (("train", 0), ("valid", 1), ("test", 2)):
        write_corpus(root / f"{name}.txt", 60, seed)
    return root


def build(configs, root, tmp_path, extra=()):
    args = [f"--config={c}" for c in configs] + [
        f"--data.train={root / 'train.txt'}", f"--data.val={root / 'valid.txt'}", f"--data.test={root / 'test.txt'}",
        "--data.train_lines=null", "--data.val_lines=null", "--data.test_lines=null", "--data.max_vocab=null",
        "--data.label_column=false", "--data.unk_token=<unk>",
        "--model.embed_dim=8", "--model.hidden_dim=12", "--model.test_iw_samples=2",
        f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.accelerator=cpu", *extra,
    ]  # fmt: skip
    return SeqVAECLI(args=args, run=False)


def demo_args(tiny, tmp_path, epochs=1):
    """demo.yaml on the tiny corpus, at a tiny width, logging under tmp_path."""
    return [f"--config={CONFIGS / 'demo.yaml'}", f"--data.train={tiny / 'train.txt'}", f"--data.val={tiny / 'valid.txt'}",
            f"--data.test={tiny / 'test.txt'}", "--model.embed_dim=8", "--model.hidden_dim=12", "--model.latent_dim=4",
            "--model.test_iw_samples=2", f"--trainer.logger.init_args.save_dir={tmp_path}", f"--trainer.max_epochs={epochs}",
            "--trainer.enable_model_summary=false"]  # fmt: skip


def test_every_variant_has_all_three_datasets():
    for ds in ("yahoo", "yelp"):
        assert sorted(p.stem for p in (CONFIGS / ds).glob("*.yaml") if not p.stem.startswith("base")) == VARIANTS


@pytest.mark.parametrize("dataset", ["yahoo", "yelp", "yahoo10k"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_config_instantiates(dataset, variant, tiny, tmp_path):
    extra = ["--model.init_encoder_from=null"] if variant in ("freebits", "recommended") else []
    cli = build([CONFIGS / dataset / "base.yaml", CONFIGS / dataset / f"{variant}.yaml"], tiny, tmp_path, extra)
    model = cli.model
    assert model.hparams.vocab_size == cli.datamodule.vocab_size  # linked
    # yahoo10k's recipe: the lengths of the grids it was measured in
    # iVAE's reference protocol (SPEC §11.4): 40 epochs
    assert cli.trainer.max_epochs == {("yahoo10k", "recommended"): 20, ("yahoo10k", "recommended_autoencoder"): 6}.get(
        (dataset, variant), 40 if variant in ("ivae", "ivae_mi") else 100
    )
    if variant == "lm":
        assert model.encoder is None
    if variant in ("last", "avg", "max", "abs"):
        assert model.hparams.pooling == variant
    if variant == "aggressive":
        assert model.aggressive is not None and model.aggressive.active
    if variant == "sa_vae":
        assert (model.refine.steps, model.refine.lr, model.refine.momentum, model.refine.clip) == (10, 1.0, 0.5, 5.0)
    if variant in ("autoencoder", "recommended_autoencoder"):
        assert model.kl_schedule.weight(0, 10, 100) == 0.0 and cli.trainer.checkpoint_callback.monitor == "val/rec"


@pytest.mark.parametrize("variant", VARIANTS)
def test_yahoo10k_variant_trains(variant, tiny, tmp_path):
    extra = ["--model.init_encoder_from=null"] if variant in ("freebits", "recommended") else []
    extra += ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2",
              "--trainer.enable_model_summary=false", "--trainer.num_sanity_val_steps=0"]  # fmt: skip
    if variant == "aggressive":
        extra += ["--model.aggressive.init_args.max_inner_steps=3"]
    cli = build([CONFIGS / "yahoo10k/base.yaml", CONFIGS / f"yahoo10k/{variant}.yaml"], tiny, tmp_path, extra)
    before = [p.detach().clone() for p in cli.model.parameters() if p.requires_grad]
    cli.trainer.fit(cli.model, cli.datamodule)
    after = [p for p in cli.model.parameters() if p.requires_grad]
    assert all(not torch.equal(a, b) for a, b in zip(before, after))
    assert torch.isfinite(cli.trainer.callback_metrics["val/loss"])


@pytest.mark.parametrize("dataset", ["yahoo10k", "yahoo", "yelp"])
def test_recommended_stage_two_starts_from_stage_ones_encoder_at_the_path_it_names(dataset, tiny, tmp_path, monkeypatch):
    """The recipe's two files chain as their comments say: stage 1 saves where stage 2 reads
    (relative to where both run), and stage 2 starts from that encoder with free bits."""
    import pytorch_lightning as pl

    from seqvae import FreeBits

    monkeypatch.chdir(tmp_path)
    short = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2",
             "--trainer.enable_model_summary=false", "--trainer.num_sanity_val_steps=0",
             f"--trainer.logger.init_args.save_dir=runs/{dataset}"]  # fmt: skip
    stage1 = build([CONFIGS / dataset / "base.yaml", CONFIGS / dataset / "recommended_autoencoder.yaml"], tiny, tmp_path, short)
    stage1.trainer.fit(stage1.model, stage1.datamodule)
    stage2 = build([CONFIGS / dataset / "base.yaml", CONFIGS / dataset / "recommended.yaml"], tiny, tmp_path, short)
    best = Path(stage1.trainer.checkpoint_callback.best_model_path).resolve()
    assert Path(stage2.model.hparams.init_encoder_from).resolve() == best
    assert isinstance(stage2.model.kl_penalty, FreeBits) and stage2.model.hparams.pooling == "max"
    seen = {}

    class Capture(pl.Callback):  # the encoder after setup, before the first update
        def on_train_start(self, trainer, module):
            seen.update({k: v.clone() for k, v in module.encoder.state_dict().items()})

    stage2.trainer.callbacks.append(Capture())
    stage2.trainer.fit(stage2.model, stage2.datamodule)
    saved = torch.load(best, weights_only=True)["state_dict"]
    assert seen and all(torch.equal(v, saved[f"encoder.{k}"]) for k, v in seen.items())


def test_predict_writes_one_reconstruction_per_input_line_in_order(tiny, tmp_path):
    common = [f"--config={CONFIGS / 'demo.yaml'}", f"--data.train={tiny / 'train.txt'}", f"--data.val={tiny / 'valid.txt'}",
              f"--data.test={tiny / 'test.txt'}", "--model.embed_dim=8", "--model.hidden_dim=12", "--model.latent_dim=4",
              "--model.test_iw_samples=2", "--model.val_iw_samples=0", f"--trainer.logger.init_args.save_dir={tmp_path}",
              "--trainer.max_epochs=1", "--trainer.enable_model_summary=false"]  # fmt: skip
    SeqVAECLI(args=["fit", *common])
    run = tmp_path / "demo" / "version_0"
    ckpt = run / "checkpoints" / "best.ckpt"
    lines = ["the cat sat", "a dog ran on the big red mat under the log", "blue"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    SeqVAECLI(args=["predict", *common, f"--data.predict={tmp_path / 'in.txt'}", f"--ckpt_path={ckpt}"])
    out = (tmp_path / "demo" / "version_1" / "predictions.txt").read_text().splitlines()
    assert not list((tmp_path / "demo" / "version_1").glob("events.out.tfevents.*"))  # no empty run in TensorBoard
    from seqvae import SeqVAE

    model = SeqVAE.load_from_checkpoint(ckpt)
    # file order kept: line i of the output is the API's reconstruction of input line i, with the
    # same defaults (greedy, at most the batch's longest input + 20 tokens)
    assert out == model.reconstruct(lines)
    from seqvae.core import generation

    lengths = []
    real_decode = generation.decode

    def recording(model, z, n, max_length, *args):
        lengths.append(max_length)
        return real_decode(model, z, n, max_length, *args)

    generation.decode, predicted = recording, lengths
    try:
        SeqVAECLI(args=["predict", *common, f"--data.predict={tmp_path / 'in.txt'}", f"--ckpt_path={ckpt}"])
        predicted, lengths = lengths, []
        model.reconstruct(lines)
        model.sample(2)
        model.interpolate(*lines[:2])
    finally:
        generation.decode = real_decode
    assert predicted == [11 + 2 + 20] and lengths == [11 + 2 + 20, 100, 100]
    # a missing input file: one line naming the option, and no new run directory
    runs = sorted((tmp_path / "demo").iterdir())
    with pytest.raises(CorpusError, match=r"^data\.predict: .*nofile\.txt: no such file$"):
        SeqVAECLI(args=["predict", *common, f"--data.predict={tmp_path / 'nofile.txt'}", f"--ckpt_path={ckpt}"])
    assert sorted((tmp_path / "demo").iterdir()) == runs
    # empty and whitespace-only input lines (skipped by the reader) keep their place: output
    # line n still answers input line n, an empty line where there was no text
    (tmp_path / "gaps.txt").write_text(f"\n{lines[0]}\n  \t\n{lines[1]}\n{lines[2]}\n\n")
    SeqVAECLI(args=["predict", *common, f"--data.predict={tmp_path / 'gaps.txt'}", f"--ckpt_path={ckpt}"])
    gaps = (tmp_path / "demo" / "version_3" / "predictions.txt").read_text().split("\n")
    assert gaps == ["", out[0], "", out[1], out[2], "", ""]  # six lines, each ended by a newline


def test_export_and_compare_round_trip(tiny, tmp_path, capsys):
    import json

    from seqvae.commands import main

    args = demo_args(tiny, tmp_path, epochs=2)
    SeqVAECLI(args=["fit", *args])
    run = tmp_path / "demo" / "version_0"
    with pytest.raises(SystemExit) as done:
        main(["export", str(run), str(tmp_path / "out" / "demo" / "seed1")])
    assert done.value.code == 0
    exported = tmp_path / "out" / "demo" / "seed1"
    assert sorted(p.name for p in exported.iterdir()) == ["config.yaml", "curves.csv", "metrics.json", "per_text.csv"]
    rows = (exported / "curves.csv").read_text().splitlines()
    assert len(rows) == 3 and "val/kl" in rows[0] and "train/lr" in rows[0]  # header + one row per epoch
    capsys.readouterr()
    from seqvae.analysis.compare import main as compare

    compare([str(exported), "--format", "json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    metrics = json.loads((run / "metrics.json").read_text())
    assert len(rows) == 1 and rows[0]["n"] == 1
    assert rows[0]["iw_nll"]["mean"] == pytest.approx(metrics["test/iw_nll"])
    assert rows[0]["neg_elbo"]["mean"] == pytest.approx(metrics["test/loss"])
    # another run's export over this one is refused, and it stays whole; the same run again is fine
    SeqVAECLI(args=["fit", *args])
    before = {p.name: p.read_bytes() for p in exported.iterdir()}
    with pytest.raises(SystemExit) as done:
        main(["export", str(tmp_path / "demo" / "version_1"), str(exported)])
    assert done.value.code == 2 and f"{exported} holds another run's results" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in exported.iterdir()} == before
    with pytest.raises(SystemExit) as done:
        main(["export", str(run), str(exported)])
    assert done.value.code == 0
    # a destination that is (or lies under) a file: one line, the file untouched
    for dest in (exported / "curves.csv", exported / "curves.csv" / "seed1"):
        with pytest.raises(SystemExit) as done:
            main(["export", str(run), str(dest)])
        assert done.value.code == 2
        assert capsys.readouterr().err == f"seqvae export: error: {dest}: {exported / 'curves.csv'} is a file, not a directory\n"
    assert {p.name: p.read_bytes() for p in exported.iterdir()} == before
    # Refused before anything is written (before: DEST = RUN rewrote its curves.csv, then a traceback; a run directory
    # as DEST had its config.yaml replaced; a metrics.json that is no JSON object was copied or failed half-way)
    other = tmp_path / "demo" / "version_1"
    (other / "metrics.json").unlink()  # an unfinished run: checkpoints, no results yet
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.yaml").write_text("data: {}\n")
    files = lambda d: {p: p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}  # noqa: E731
    kept = {d: files(d) for d in (run, other, odd)}
    for source, dest, says in [
        (run, run, f"{run}: is the run directory itself; export to another directory"),
        (run, other, f"{other}: is a run directory (checkpoints or event files): export elsewhere"),
        (odd, tmp_path / "o1", f"{odd}: not a finished run (no metrics.json)"),
        (tmp_path / "nothing", tmp_path / "o2", f"{tmp_path / 'nothing'}: no such run directory"),
    ]:
        with pytest.raises(SystemExit) as done:
            main(["export", str(source), str(dest)])
        assert done.value.code == 2 and capsys.readouterr().err == f"seqvae export: error: {says}\n"
    for text, says in (("[1, 2]", "not a JSON object of metrics"), ('{"test/iw_nll": ', "not readable JSON (")):
        (odd / "metrics.json").write_text(text)
        kept[odd] = files(odd)
        with pytest.raises(SystemExit) as done:
            main(["export", str(odd), str(tmp_path / "o3")])
        err = capsys.readouterr().err
        assert done.value.code == 2 and err.startswith(f"seqvae export: error: {odd / 'metrics.json'}: {says}")
    assert {d: files(d) for d in (run, other, odd)} == kept
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3"))


def test_predict_generation_modes(tiny, tmp_path, capsys):
    """`seqvae predict` for each mode and decoding: one text per line, seeded, never overwriting."""
    from seqvae import SeqVAE
    from seqvae.core.model import ConfigError

    common = [f"--config={CONFIGS / 'demo.yaml'}", f"--data.train={tiny / 'train.txt'}", f"--data.val={tiny / 'valid.txt'}",
              f"--data.test={tiny / 'test.txt'}", "--model.embed_dim=8", "--model.hidden_dim=12", "--model.latent_dim=4",
              "--model.test_iw_samples=2", "--model.val_iw_samples=0", f"--trainer.logger.init_args.save_dir={tmp_path}",
              "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.enable_model_summary=false"]  # fmt: skip
    SeqVAECLI(args=["fit", *common])
    ckpt = tmp_path / "demo" / "version_0" / "checkpoints" / "best.ckpt"
    lines = ["the cat sat", "a dog ran on the big red mat", "blue", "small log under the mat"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    version = iter(range(1, 100))

    def predict(*options):
        capsys.readouterr()
        SeqVAECLI(args=["predict", *common, f"--data.predict={tmp_path / 'in.txt'}", f"--ckpt_path={ckpt}", *options])
        return (tmp_path / "demo" / f"version_{next(version)}" / "predictions.txt").read_text().splitlines()

    model = SeqVAE.load_from_checkpoint(ckpt)
    beam = predict("--model.generation.decoding=beam", "--model.generation.beam_width=3", "--model.generation.max_length=12")
    assert beam == model.reconstruct(lines, max_length=12, decoding="beam", beam_width=3)
    sampled = predict("--model.generation.decoding=sample", "--model.generation.temperature=0.7", "--model.generation.seed=5")
    assert len(sampled) == 4 and sampled == predict(
        "--model.generation.decoding=sample", "--model.generation.temperature=0.7", "--model.generation.seed=5"
    )
    assert sampled == predict("--model.generation.temperature=0.7", "--model.generation.seed=5")  # a temperature samples
    runs = sorted((tmp_path / "demo").iterdir())
    with pytest.raises(ConfigError, match=r"^model.generation.temperature 0.7: only decoding 'sample' uses it"):
        SeqVAECLI(args=["predict", *common, f"--ckpt_path={ckpt}", "--model.generation.decoding=greedy",
                        "--model.generation.temperature=0.7"])  # fmt: skip
    assert sorted((tmp_path / "demo").iterdir()) == runs  # refused before a run directory was made
    prior = ["--model.generation.mode=sample", "--model.generation.n=7", "--model.generation.decoding=sample",
             "--model.generation.seed=2"]  # fmt: skip
    first = predict(*prior, "--model.generation.stdout=true")
    assert capsys.readouterr().out == "".join(t + "\n" for t in first) and len(first) == 7
    assert predict(*prior) == first  # same seed, same texts
    assert first == model.sample(7, decoding="sample", seed=2)  # the API with the same seed draws the same z and words
    greedy = predict("--model.generation.mode=sample", "--model.generation.n=7", "--model.generation.seed=2")
    assert greedy == model.sample(7, seed=2)  # the same default decoding (greedy) both ways
    steps = ["--model.generation.mode=interpolate", "--model.generation.steps=3", "--model.generation.max_length=12"]
    path = predict(*steps, "--data.eval_batch_size=3")  # a pair split across two batches
    assert len(path) == 2 * 3
    for i, (a, b) in enumerate([lines[:2], lines[2:]]):
        assert path[3 * i : 3 * i + 3] == model.interpolate(a, b, steps=3, max_length=12)
        assert [path[3 * i], path[3 * i + 2]] == model.reconstruct([a, b], max_length=12)  # ends: the two posterior means
    (tmp_path / "odd.txt").write_text("a b\nthe cat\nblue\n")
    with pytest.raises(ConfigError, match="pairs of lines"):
        SeqVAECLI(args=["predict", *common, f"--data.predict={tmp_path / 'odd.txt'}", f"--ckpt_path={ckpt}", *steps])


def test_short_grid_cells_build_at_the_short_scale(tiny, tmp_path, monkeypatch):
    from seqvae import ConstantKL, CyclicalKL, LinearKLWarmup
    from seqvae.experiments import sweep

    monkeypatch.chdir(CONFIGS.parent)
    cells = sweep.load_grid("configs/sweeps/yahoo10k_short.yaml")
    aggressive = {"aggressive", "aggressive_joint"}  # their own grid file: one cell costs more than the grid
    recipe = {"recommended_autoencoder", "recommended"}  # not methods: settings of autoencoder + freebits
    # the rows added after the short grid ran (iVAE, WAE-RNF, SA-VAE): their own grid file
    later = {c.variant for c in sweep.load_grid("configs/sweeps/yahoo10k_table1_rest.yaml")}
    assert later == {"ivae", "ivae_mi", "ivae_sgd", "ivae_mi_sgd", "wae_rnf", "sa_vae"}
    yelp = sweep.load_grid("configs/sweeps/yelp10k_table1_rest.yaml")  # the same rows at yelp10k
    assert {c.variant for c in yelp} == later and all("configs/yelp10k/base.yaml" in c.args for c in yelp)
    assert sorted({c.variant for c in cells}) == sorted(set(VARIANTS) - aggressive - recipe - later)
    assert {c.variant for c in sweep.load_grid("configs/sweeps/yahoo10k_short_aggressive.yaml")} == aggressive
    assert all(c.export_dir == Path("docs/results/yahoo10k_short") / c.variant / f"seed{c.seed}" for c in cells)
    for cell in (c for c in cells if c.seed == 1):
        configs = [cell.args[i + 1] for i, a in enumerate(cell.args) if a == "--config"]
        rest = [a for i, a in enumerate(cell.args) if a != "--config" and (i == 0 or cell.args[i - 1] != "--config")]
        rest = [f"{k}={v}" for k, v in zip(rest[::2], rest[1::2]) if not k.startswith("--trainer.logger")]
        if cell.variant == "freebits":
            assert "--model.init_encoder_from=runs/yahoo10k_short/autoencoder/seed1/checkpoints/best.ckpt" in rest
            rest = [a for a in rest if not a.startswith("--model.init_encoder_from")] + ["--model.init_encoder_from=null"]
        cli = build(configs, tiny, tmp_path, rest)
        assert cli.trainer.max_epochs == 6, cell.variant
        schedule = cli.model.kl_schedule
        expected = {"beta": ConstantKL, "autoencoder": ConstantKL, "cyclical": CyclicalKL}.get(cell.variant, LinearKLWarmup)
        assert type(schedule) is expected, cell.variant
        if expected is LinearKLWarmup:  # 3 warm-up epochs, whatever the variant's own length
            assert schedule.warmup_epochs == 3 and schedule.start == (0.0 if cell.variant == "freebits" else 0.1)


def test_test_with_checkpoint_takes_evaluation_settings_from_the_command(tiny, tmp_path):
    # Lightning puts the checkpoint's hyper-parameters over the command's model config; the
    # architecture must come from the checkpoint, but K, the eval seed etc. from the command.
    import json

    common = [f"--config={CONFIGS / 'demo.yaml'}", f"--data.train={tiny / 'train.txt'}", f"--data.val={tiny / 'valid.txt'}",
              f"--data.test={tiny / 'test.txt'}", "--model.embed_dim=8", "--model.hidden_dim=12", "--model.latent_dim=4",
              f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.max_epochs=1",
              "--trainer.enable_model_summary=false"]  # fmt: skip
    SeqVAECLI(args=["fit", *common, "--model.test_iw_samples=2", "--model.val_iw_samples=0"])
    run = tmp_path / "demo" / "version_0"
    assert json.loads((run / "metrics.json").read_text())["iw_samples"] == 2
    ckpt = run / "checkpoints" / "best.ckpt"
    plain = [a for a in common if "dim=" not in a]  # the architecture is not given: from the checkpoint
    cli = SeqVAECLI(args=["test", *plain, f"--ckpt_path={ckpt}", "--model.test_iw_samples=7", "--model.eval_seed=3"])
    assert (cli.model.hparams.hidden_dim, cli.model.hparams.test_iw_samples, cli.model.hparams.eval_seed) == (12, 7, 3)
    assert json.loads((tmp_path / "demo" / "version_1" / "metrics.json").read_text())["iw_samples"] == 7


def test_encoder_diagnostics_on_a_trained_run(tiny, tmp_path, capsys):
    from seqvae import diagnostics as tool

    args = demo_args(tiny, tmp_path)
    SeqVAECLI(args=["fit", *args])
    run = tmp_path / "demo" / "version_0"
    d = tool.diagnose(run, batches=2)
    params = d["params"]
    assert set(params) == {n for n, _ in SeqVAECLI(args=args, run=False).model.named_parameters()}
    trained = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"]
    assert params["encoder.lstm.weight_ih_l0"]["norm"] == pytest.approx(float(trained["encoder.lstm.weight_ih_l0"].norm()))
    assert all(r["grad"] > 0 for n, r in params.items() if n.startswith(("encoder.embed", "encoder.lstm", "encoder.to_")))
    assert 0 < d["clip_factor"] <= 1 and 0 < d["feature_std"] and 0 < d["mu_std"]
    from seqvae.commands import main

    with pytest.raises(SystemExit) as done:
        main(["diagnose", str(run), "--batches", "1"])
    assert done.value.code == 0
    assert "encoder features: mean |h|" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:  # 0 batches would print zero gradients: "not learning"
        main(["diagnose", str(run), "--batches", "0"])
    assert done.value.code == 2 and "--batches: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        tool.diagnose(run, checkpoint="nope")
    err = capsys.readouterr().err
    assert done.value.code == 2 and err == f"seqvae diagnose: error: {run}/checkpoints/nope.ckpt: no such checkpoint\n"


def test_no_shipped_config_trains_in_reduced_precision():
    """The collapse comparisons train in fp32 (Lightning's default): bf16 training changed KL, AU
    and MI of short BN-VAE runs (scripts/studies.py precision; docs/performance.md), so no config
    may switch it on quietly. A user still can, with --trainer.precision bf16-mixed."""
    import yaml

    from seqvae.analysis.runs import flatten

    files = sorted(CONFIGS.rglob("*.yaml"))  # run configs and sweep grids (overrides: {trainer.precision: …})
    assert len(files) > 20
    for path in files:
        settings = flatten(yaml.safe_load(path.read_text()) or {})
        for key, value in settings.items():
            if key.endswith("precision"):
                assert value in (32, "32", "32-true"), f"{path}: {key} {value}"
