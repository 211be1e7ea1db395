"""SeqVAE module: training changes every parameter, padding/bucketing agree, the Python API,
the plateau rule, and the IW-NLL invariants at model level."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch

from seqvae import AggressiveTraining, ConstantKL, CosineDispersion, PlateauRule, SeqVAE, TextDataModule

WORDS = "the a cat dog sat ran on under mat log big small red blue".split()


def write_corpus(path, n, seed, min_len=2, max_len=9):
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_len, max_len))) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return lines


@pytest.fixture
def corpus(tmp_path):
    write_corpus(tmp_path / "train.txt", 120, 0)
    val = write_corpus(tmp_path / "valid.txt", 40, 1)
    write_corpus(tmp_path / "test.txt", 40, 2)
    return tmp_path, val


def tiny_model(vocab_size, **kw):
    args = dict(embed_dim=8, hidden_dim=12, latent_dim=4, val_iw_samples=0, test_iw_samples=5)
    args.update(kw)
    return SeqVAE(vocab_size, **args)


def batches_of(model, texts, batch_size):
    """The texts' `<s> … </s>` id batches, in input order (what the scoring API feeds the model)."""
    from seqvae.text.datamodule import collate

    ids = model.vocab.encode([t.split() for t in texts])
    for s in range(0, len(ids), batch_size):
        yield collate([torch.tensor(x) for x in ids[s : s + batch_size]])


def datamodule(root, **kw):
    return TextDataModule(str(root / "train.txt"), str(root / "valid.txt"), str(root / "test.txt"), batch_size=8, **kw)


def trainer(tmp_path, **kw):
    args = dict(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
    )
    args.update(kw)
    return pl.Trainer(**args)


@pytest.mark.parametrize(
    "pooling,kind",
    [
        ("last", "vae"),
        ("avg", "vae"),
        ("max", "vae"),
        ("abs", "vae"),
        ("max", "lm"),
        ("abs", "skip+cosine"),
        ("avg", "bn"),
        ("last", "aggressive"),
    ],
)
def test_every_parameter_trains(corpus, tmp_path, pooling, kind):
    root, _ = corpus
    dm = datamodule(root)
    pl.seed_everything(0)
    kw = {
        "lm": dict(latent_dim=0),
        "skip+cosine": dict(skip=True, regularizers=[CosineDispersion(1.0)]),
        "bn": dict(bn_gamma=0.5),
        "aggressive": dict(aggressive=AggressiveTraining(max_inner_steps=3)),
    }.get(kind, {})
    model = tiny_model(dm.vocab_size, pooling=pooling, **kw)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer(tmp_path, limit_train_batches=4, limit_val_batches=0).fit(model, dm)
    unchanged = [n for n, p in model.named_parameters() if p.requires_grad and torch.equal(p, before[n])]
    assert unchanged == []
    assert model.num_updates == 4


def test_kl_weight_follows_update_counter(corpus, tmp_path):
    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size)
    seen = []
    model.loss_terms_orig = model.loss_terms
    model.loss_terms = lambda batch, w: (seen.append(w), model.loss_terms_orig(batch, w))[1]
    trainer(tmp_path, max_epochs=2, limit_val_batches=0).fit(model, dm)
    n = dm.train_dataloader().batch_sampler.__len__()
    expected = [min(1.0, 0.1 + 0.9 / (10 * n) * (u + 1)) for u in range(2 * n)]
    assert seen == pytest.approx(expected)


def test_padded_equals_unpadded(corpus):
    """Encoding and decoding a text inside a padded batch gives its values alone."""
    root, val = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size, pooling="max").eval()
    model.vocab = dm.vocab
    mu, logvar = model.encode(val, batch_size=64)
    for i in (0, 7, 19):
        mu1, logvar1 = model.encode([val[i]])
        torch.testing.assert_close(mu[i : i + 1], mu1)
        torch.testing.assert_close(logvar[i : i + 1], logvar1)
    batch = next(batches_of(model, val[:16], 16))
    z = mu[:16].unsqueeze(1)
    ll = model.decoder.log_likelihood(batch["tokens"], batch["lengths"], z)
    for i in range(16):
        alone = next(batches_of(model, [val[i]], 1))
        torch.testing.assert_close(ll[i], model.decoder.log_likelihood(alone["tokens"], alone["lengths"], z[i : i + 1])[0])


def test_bucketed_and_padded_batching_agree_on_deterministic_metrics(corpus, tmp_path):
    root, _ = corpus
    results = {}
    for batching in ("bucket", "padded"):
        dm = datamodule(root, batching=batching)
        pl.seed_everything(0)
        model = tiny_model(dm.vocab_size, pooling="abs")
        results[batching] = trainer(tmp_path).validate(model, dm, verbose=False)[0]
    for key in ("val/kl", "val/au", "val/feature_cos"):
        assert results["bucket"][key] == pytest.approx(results["padded"][key], rel=1e-5, abs=1e-6)
    # rec uses one z sample per sentence, drawn in batch order: close, not equal
    assert results["bucket"]["val/rec"] == pytest.approx(results["padded"]["val/rec"], rel=0.02)


def test_iw_nll_invariants_at_model_level(corpus):
    root, val = corpus
    dm = datamodule(root)
    torch.manual_seed(0)
    model = tiny_model(dm.vocab_size)
    model.vocab = dm.vocab
    with torch.no_grad():  # the default init gives sigma ~ 1, mu ~ 0 and a decoder that ignores z
        model.encoder.to_posterior.weight.normal_(0, 0.5)
        model.decoder.z_to_c0.weight.normal_(0, 2.0)
        model.decoder.out.weight.normal_(0, 1.0)
    torch.manual_seed(1)
    elbo = torch.stack([model.elbo(val) for _ in range(20)]).mean(0)
    iw = model.iw_nll(val, n_samples=50)
    assert torch.all(iw <= elbo + 1e-3 * elbo.abs())
    assert iw.mean() < elbo.mean()
    lm = tiny_model(dm.vocab_size, latent_dim=0)
    lm.vocab = dm.vocab
    torch.testing.assert_close(lm.iw_nll(val, n_samples=7), lm.elbo(val))  # exact NLL


def test_python_api_after_checkpoint_round_trip(corpus, tmp_path):
    root, val = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size, kl_schedule=ConstantKL(0.5))
    t = trainer(tmp_path, limit_train_batches=3, limit_val_batches=0, enable_checkpointing=True)
    t.fit(model, dm)
    path = tmp_path / "m.ckpt"
    t.save_checkpoint(path)
    loaded = SeqVAE.load_from_checkpoint(path)
    assert loaded.vocab.encode([v.split() for v in val]) == dm.vocab.encode([v.split() for v in val])
    assert loaded.num_updates == 3 and isinstance(loaded.kl_schedule, ConstantKL) and loaded.kl_schedule.value == 0.5
    mu, logvar = model.encode(val)
    mu2, logvar2 = loaded.encode(val, batch_size=3)  # any batch size, input order kept
    torch.testing.assert_close(mu, mu2)
    torch.testing.assert_close(logvar, logvar2)
    was = loaded.training
    loaded.iw_nll(val[:2], n_samples=3)
    assert loaded.training == was
    assert loaded.encode([])[0].shape == (0, 4) and loaded.elbo([]).shape == (0,)


def test_the_api_refuses_bad_input_in_one_line(corpus, tmp_path):
    # A new user's findings: one string was scored letter by letter, counts of 0 gave empty results or
    # the default, negative ones torch errors, a bad checkpoint file torch's traceback.
    from seqvae.errors import ConfigError, CorpusError

    root, val = corpus
    model = listening_model(root)
    with pytest.raises(ConfigError, match=r"^texts: expected a list of texts, got one str: wrap it, \[text\]$"):
        model.elbo(val[0])
    with pytest.raises(ConfigError, match=r"^texts\[1\]: expected a string \(or a list of words\), got int 5$"):
        model.encode([val[0], 5])
    for call, says in [
        (lambda: model.sample(0), "n: must be an integer >= 1, got 0"),
        (lambda: model.interpolate(val[0], val[1], steps=1), "steps: must be an integer >= 2, got 1"),
        (lambda: model.reconstruct(val[:2], max_length=0), "max_length: must be an integer >= 1, got 0"),
        (lambda: model.iw_nll(val[:2], n_samples=0), "n_samples: must be an integer >= 1, got 0"),
        (lambda: model.elbo(val[:2], batch_size=0), "batch_size: must be an integer >= 1, got 0"),
    ]:
        with pytest.raises(ConfigError) as err:
            call()
        assert str(err.value) == says
    text = tmp_path / "notes.ckpt"
    text.write_text("hello\n")
    with pytest.raises(CorpusError, match="checkpoint_path: .*notes.ckpt: not a readable checkpoint"):
        SeqVAE.load_from_checkpoint(text)
    with pytest.raises(CorpusError, match="checkpoint_path: no such checkpoint file"):
        SeqVAE.load_from_checkpoint(tmp_path / "missing.ckpt")


def test_encode_gives_a_full_covariance_posteriors_shared_factor_once(corpus):
    from seqvae.core.posteriors import FullCovGaussianPosterior

    root, val = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size, posterior=FullCovGaussianPosterior())
    model.vocab = dm.vocab
    for batch_size in (3, 64):  # was one (Z, Z) block per batch, stacked: its shape depended on batch_size
        mu, L = model.encode(val[:10], batch_size=batch_size)
        assert mu.shape == (10, 4) and L.shape == (4, 4)


def test_encoder_hidden_dim_widens_the_encoder_alone(corpus, tmp_path):
    from seqvae.rundir.run_files import run_hparams

    root, val = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size, encoder_hidden_dim=20, val_iw_samples=3)
    assert model.encoder.lstm.hidden_size == 20 and model.encoder.to_posterior.in_features == 20
    assert model.decoder.lstm.hidden_size == 12 and tiny_model(dm.vocab_size).encoder.lstm.hidden_size == 12
    t = trainer(tmp_path, limit_train_batches=2, limit_val_batches=2, enable_checkpointing=True)
    t.fit(model, dm)
    assert math.isfinite(float(t.callback_metrics["val/feature_cos"]))
    path = tmp_path / "wide.ckpt"
    t.save_checkpoint(path)
    loaded = SeqVAE.load_from_checkpoint(path)
    assert loaded.encoder.lstm.hidden_size == 20 and loaded.decoder.lstm.hidden_size == 12
    assert loaded.features(val).shape == (len(val), 20) and loaded.features([]).shape == (0, 20)
    assert run_hparams(loaded, 1)["encoder_hidden_dim"] == 20 and run_hparams(loaded, 1)["hidden_dim"] == 12


def fake_trainer(model, best_path, epoch, value):
    opts = model.configure_optimizers()
    return SimpleNamespace(
        sanity_checking=False,
        state=SimpleNamespace(fn="fit"),
        callback_metrics={"val/loss": torch.tensor(value)},
        current_epoch=epoch,
        checkpoint_callback=SimpleNamespace(best_model_path=best_path),
        optimizers=opts,
        should_stop=False,
    )


def test_plateau_rule_halves_reloads_and_stops(tmp_path):
    model = tiny_model(20)
    best_state = {k: torch.full_like(v, 0.123) for k, v in model.state_dict().items()}
    torch.save({"state_dict": best_state}, tmp_path / "best.ckpt")
    rule = PlateauRule(patience=2, min_epochs=3, max_decays=2)
    opts = model.configure_optimizers()
    losses = [10, 9, 9.5, 9.6, 9.7, 9.8, 9.9, 10.0, 10.1]  # epochs 0..8
    decays_after = []
    for epoch, value in enumerate(losses):
        t = fake_trainer(model, str(tmp_path / "best.ckpt"), epoch, value)
        t.optimizers = opts
        rule.on_validation_end(t, model)
        decays_after.append(rule.decays)
        if t.should_stop:
            break
    # Epochs 2, 3 are bad (2 in a row) and epoch 3 ≥ min_epochs: decay 1; bar reset to 9.6;
    # epochs 4, 5 bad again: decay 2 = max_decays -> stop at epoch 5.
    assert decays_after == [0, 0, 0, 1, 1, 2]
    assert all(g["lr"] == pytest.approx(0.25) for o in opts for g in o.param_groups)
    assert torch.equal(model.decoder.out.weight, best_state["decoder.out.weight"])
    state = rule.state_dict()
    again = PlateauRule()
    again.load_state_dict(state)
    assert again.state_dict() == state == {"best": pytest.approx(9.8), "bad_epochs": 0, "decays": 2}


def test_plateau_rule_waits_for_min_epochs(tmp_path):
    model = tiny_model(20)
    rule = PlateauRule(patience=1, min_epochs=15)
    opts = model.configure_optimizers()
    for epoch, value in enumerate([5, 6, 7, 8]):
        t = fake_trainer(model, "", epoch, value)
        t.optimizers = opts
        rule.on_validation_end(t, model)
    assert rule.decays == 0 and opts[0].param_groups[0]["lr"] == 1.0
    # switched off: the losses that decay an enabled rule twice and stop it change nothing
    off = PlateauRule(patience=1, min_epochs=0, max_decays=1, enabled=False)
    for epoch, value in enumerate([5, 6, 7, 8]):
        t = fake_trainer(model, "", epoch, value)
        t.optimizers = opts
        off.on_validation_end(t, model)
        assert not t.should_stop
    assert off.decays == 0 and opts[0].param_groups[0]["lr"] == 1.0


def test_evaluation_is_deterministic(corpus, tmp_path):
    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size, val_iw_samples=4)
    t = trainer(tmp_path)
    torch.manual_seed(123)
    first = t.validate(model, dm, verbose=False)[0]
    torch.manual_seed(123)
    torch.rand(7)  # a different global RNG state must not change the metrics
    second = t.validate(model, dm, verbose=False)[0]
    assert first == second


def test_importance_samples_change_only_the_iw_nll(corpus, tmp_path):
    """Each kind of evaluation noise has its own stream: validating the same model with another K
    gives the same −ELBO, reconstruction term and MI (they once shared one stream, so K shifted the
    z of everything drawn after the first batch's importance samples)."""
    root, _ = corpus
    dm = datamodule(root)
    torch.manual_seed(0)
    model = tiny_model(dm.vocab_size, val_iw_samples=2)
    with torch.no_grad():  # an encoder whose posteriors differ, so that rec and MI depend on their draws
        model.encoder.to_posterior.weight.normal_(0, 1.0)
    t = trainer(tmp_path)
    few = t.validate(model, dm, verbose=False)[0]
    model.hparams.val_iw_samples = 9
    many = t.validate(model, dm, verbose=False)[0]
    assert few["val/iw_nll"] != many["val/iw_nll"]
    for key in ("val/loss", "val/rec", "val/kl", "val/mi", "val/mi_dataset"):
        assert few[key] == many[key], key
    assert len(dm.val_dataloader()) > 1  # the draws after a first batch are what K shifted


def test_greedy_generation_agrees_with_teacher_forced_decoder(corpus):
    """Each greedily generated token is the argmax of the decoder run over the generated prefix."""
    from seqvae.text.datamodule import BOS_ID, EOS_ID

    root, val = corpus
    dm = datamodule(root)
    torch.manual_seed(0)
    for kw in ({}, {"skip": True}, {"latent_dim": 0}):
        model = tiny_model(dm.vocab_size, **kw).eval()
        with torch.no_grad():
            model.decoder.out.weight.normal_(0, 2.0)
            if model.decoder.z_to_c0 is not None:
                model.decoder.z_to_c0.weight.normal_(0, 2.0)
        z = torch.randn(5, 4) if model.encoder is not None else None
        ids = model.decoder.generate(z, 5, BOS_ID, EOS_ID, max_length=12)
        inputs = torch.cat([torch.full((5, 1), BOS_ID), ids[:, :-1]], dim=1)
        with torch.no_grad():
            expected = model.decoder(inputs, z).argmax(-1)
        for row, exp in zip(ids, expected):
            stop = (row == EOS_ID).nonzero()
            n = int(stop[0]) + 1 if len(stop) else len(row)
            assert torch.equal(row[:n], exp[:n])
            assert torch.all(row[n:] == EOS_ID)  # nothing after the first </s>


def test_reconstruct_and_sample_return_one_text_per_input(corpus):
    root, val = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size)
    model.vocab = dm.vocab
    out = model.reconstruct(val[:7], max_length=5)
    assert len(out) == 7 and all(len(t.split()) <= 5 for t in out)
    assert model.reconstruct(val[:7], max_length=5) == out  # greedy: deterministic
    samples = model.sample(3, temperature=1.0, max_length=6)
    vocab = set(dm.vocab.tokenizer.get_vocab())
    assert len(samples) == 3 and all(w in vocab for t in samples for w in t.split())


class NaNAfter:
    """A regulariser that turns NaN at its n-th call (a stand-in for a diverging run)."""

    name = "nan_after"

    def __init__(self, n):
        self.n, self.calls = n, 0

    def __call__(self, features):
        self.calls += 1
        return features.sum() * (float("nan") if self.calls >= self.n else 0.0)


def test_non_finite_loss_stops_before_touching_the_weights(corpus, tmp_path):
    from seqvae.core.model import NonFiniteError

    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size, regularizers=[NaNAfter(3)])
    snapshots = []

    class Snapshot(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            snapshots.append({k: v.clone() for k, v in module.state_dict().items()})

    with pytest.raises(NonFiniteError, match=r"non-finite nan_after, loss, grad_norm at update 3 \(epoch 0, batch index 2\)"):
        trainer(tmp_path, limit_train_batches=5, limit_val_batches=0, callbacks=[Snapshot()]).fit(model, dm)
    assert model.num_updates == 2
    for k, v in model.state_dict().items():
        assert torch.equal(v, snapshots[-1][k]), k  # the failing update changed nothing


def test_plateau_rule_fires_inside_a_real_fit(corpus, tmp_path):
    """Through Lightning's own loop (where `trainer.training` is False during validation)."""
    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size)
    losses = iter([5.0, 6.0, 7.0, 8.0, 9.0])
    real_compute = model.val_metrics.compute
    model.val_metrics.compute = lambda: {**real_compute(), "loss": torch.tensor(next(losses))}
    rule = PlateauRule(patience=2, min_epochs=0, max_decays=5)
    t = trainer(tmp_path, max_epochs=5, limit_train_batches=1, callbacks=[rule], enable_checkpointing=True)
    t.fit(model, dm)
    assert rule.decays == 2  # after epochs 3 (6, 7 worse than 5) and 5 (8, 9 worse than 7)
    assert t.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.25)


def test_resume_at_epoch_end_gives_bit_identical_parameters(corpus, tmp_path):
    from pytorch_lightning.callbacks import ModelCheckpoint

    root, _ = corpus

    def run(epochs, directory, ckpt_path=None):
        pl.seed_everything(0)
        dm = datamodule(root)
        model = tiny_model(dm.vocab_size, word_dropout=0.3)
        last = ModelCheckpoint(dirpath=directory, save_last=True)
        t = trainer(tmp_path, max_epochs=epochs, limit_train_batches=4, limit_val_batches=2, num_sanity_val_steps=2,
                    enable_checkpointing=True, callbacks=[last])  # fmt: skip
        t.fit(model, dm, ckpt_path=ckpt_path)
        return model

    straight = run(3, tmp_path / "a")
    run(1, tmp_path / "b")  # "killed" after epoch 1
    resumed = run(3, tmp_path / "b", ckpt_path=tmp_path / "b" / "last.ckpt")
    assert resumed.num_updates == straight.num_updates == 12
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_interpolation_ends_are_the_reconstructions(corpus):
    root, val = corpus
    dm = datamodule(root)
    torch.manual_seed(0)
    model = tiny_model(dm.vocab_size)
    model.vocab = dm.vocab
    with torch.no_grad():  # a decoder that listens to z, so the path is not one text
        model.decoder.z_to_c0.weight.normal_(0, 3.0)
        model.encoder.to_posterior.weight.normal_(0, 1.0)
    path = model.interpolate(val[0], val[1], steps=6, max_length=8)
    assert len(path) == 6
    assert path[0] == model.reconstruct([val[0]], max_length=8)[0]
    assert path[-1] == model.reconstruct([val[1]], max_length=8)[0]


def listening_model(root, **kw):
    """A tiny model whose decoder listens to z, so different z give different texts."""
    dm = datamodule(root)
    torch.manual_seed(0)
    model = tiny_model(dm.vocab_size, **kw)
    model.vocab = dm.vocab
    with torch.no_grad():
        model.decoder.z_to_c0.weight.normal_(0, 3.0)
        model.decoder.out.weight.normal_(0, 1.0)
        for p in model.encoder.parameters():
            p.uniform_(-1.0, 1.0)
    return model


def test_decoding_options_of_the_api(corpus):
    from seqvae.core.model import ConfigError

    root, val = corpus
    model = listening_model(root)
    greedy = model.reconstruct(val[:9], max_length=10)
    assert model.reconstruct(val[:9], max_length=10, decoding="beam", beam_width=1) == greedy
    beam = model.reconstruct(val[:9], max_length=10, decoding="beam", beam_width=4)
    assert len(beam) == 9 and model.reconstruct(val[:9], max_length=10, decoding="beam", beam_width=4, batch_size=2) == beam
    # sampling: a fixed seed gives the same texts, call after call, whatever the global RNG did
    sampled = model.reconstruct(val[:9], temperature=1.0, max_length=10, seed=3)
    torch.rand(5)
    assert model.reconstruct(val[:9], temperature=1.0, max_length=10, seed=3) == sampled
    assert model.reconstruct(val[:9], decoding="sample", temperature=1.0, max_length=10, seed=3) == sampled
    assert model.reconstruct(val[:9], temperature=1.0, max_length=10, seed=4) != sampled
    prior = model.sample(8, max_length=10, seed=0)
    assert model.sample(8, max_length=10, seed=0) == prior and model.sample(8, max_length=10, seed=1) != prior
    assert model.sample(8, max_length=10, decoding="beam", beam_width=3, seed=0) == model.sample(
        8, max_length=10, decoding="beam", beam_width=3, seed=0
    )
    with pytest.raises(ConfigError, match="temperature > 0"):
        model.reconstruct(val[:2], decoding="sample", temperature=0.0)
    with pytest.raises(ConfigError, match="beam_width"):
        model.sample(2, decoding="beam", beam_width=0)
    # Without a decoding, the setting given picks it; temperature 0 is greedy's limit.
    assert model.reconstruct(val[:9], max_length=10, beam_width=4) == beam
    assert model.reconstruct(val[:9], max_length=10, temperature=0.0) == greedy
    with pytest.raises(ConfigError, match=r"^temperature: must be >= 0 \(0: greedy\), got -1.0$"):
        model.reconstruct(val[:2], temperature=-1.0)  # was greedy, silently
    assert model.reconstruct(val[:9], max_length=10, decoding="sample", seed=3) == sampled  # temperature 1.0
    # A setting the decoding would ignore is refused, not dropped (greedy texts where samples were asked for).
    with pytest.raises(ConfigError, match=r"^temperature 0.7: only decoding 'sample' uses it, and decoding is 'greedy'$"):
        model.reconstruct(val[:2], decoding="greedy", temperature=0.7)
    with pytest.raises(ConfigError, match=r"^beam_width 3: only decoding 'beam' uses it, and decoding is 'sample'$"):
        model.sample(2, decoding="sample", beam_width=3)
    with pytest.raises(ConfigError, match=r"^temperature 0.7: only decoding 'sample' uses it, and decoding is 'beam'$"):
        model.interpolate(val[2], val[3], decoding="beam", temperature=0.7)
    with pytest.raises(ConfigError, match="give decoding"):
        model.sample(2, temperature=0.7, beam_width=3)


def test_interpolation_ends_decode_the_posterior_means(corpus):
    from seqvae.text.datamodule import BOS_ID, EOS_ID

    root, val = corpus
    model = listening_model(root).eval()
    mu, _ = model.encode(val[2:4])
    for decoding in ("greedy", "beam"):
        width = {"beam_width": 3} if decoding == "beam" else {}
        path = model.interpolate(val[2], val[3], steps=4, max_length=9, decoding=decoding, **width)
        if decoding == "greedy":
            ids = model.decoder.generate(mu, 2, BOS_ID, EOS_ID, max_length=9)
        else:
            ids = model.decoder.beam_search(mu, 2, BOS_ID, EOS_ID, max_length=9, beam_width=3)[0]
        ends = [model.vocab.decode(row.tolist()) for row in ids]
        assert len(path) == 4 and [path[0], path[-1]] == ends
    assert len(set(model.interpolate(val[2], val[3], steps=9, max_length=9))) > 1  # the path moves


# ---------------------------------------------------------------- word dropout
def dropout_tokens():
    """Three texts `<s> … </s>` with pads; row 2 already holds an unknown word (3)."""
    from seqvae.text.datamodule import BOS_ID, EOS_ID, PAD_ID, UNK_ID

    tokens = torch.tensor(
        [
            [BOS_ID, 5, 6, 7, 8, EOS_ID],
            [BOS_ID, 9, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
            [BOS_ID, UNK_ID, 10, 11, EOS_ID, PAD_ID],
        ]
    )
    return tokens, torch.tensor([6, 3, 5])


def test_word_dropout_one_replaces_every_word_but_never_bos_nor_pad():
    from seqvae.text.datamodule import BOS_ID, PAD_ID, UNK_ID

    tokens, lengths = dropout_tokens()
    model = tiny_model(20, word_dropout=1.0).train()  # rand < 1 always: every candidate is dropped
    inputs = model.decoder_inputs(tokens)
    assert inputs.shape == (3, 5)  # tokens[:, :-1]: the decoder never reads the last position
    real = torch.arange(5) < (lengths - 1).unsqueeze(1)  # the n+1 inputs `<s> w1 … wn` of each text
    assert torch.all(inputs[:, 0] == BOS_ID)
    assert torch.all(inputs[:, 1:][real[:, 1:]] == UNK_ID)
    pads = tokens[:, :-1] == PAD_ID
    assert int(pads.sum()) == 2 and torch.all(inputs[pads] == PAD_ID)
    assert inputs[1].tolist()[:2] == [BOS_ID, UNK_ID] and inputs[1].tolist()[3:] == [PAD_ID, PAD_ID]


@pytest.mark.parametrize("p", [0.3, 0.8])
def test_word_dropout_replaces_exactly_the_positions_its_seeded_draw_picks(p):
    """One U(0,1) draw per input position from the global RNG; a position is replaced by unk
    iff its draw < p, it is not the first (`<s>`) and not padding."""
    from seqvae.text.datamodule import BOS_ID, PAD_ID, UNK_ID

    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 12, (16,), generator=g)
    tokens = torch.full((16, int(lengths.max())), PAD_ID)
    for i, n in enumerate(lengths.tolist()):
        tokens[i, :n] = torch.randint(4, 20, (n,), generator=g)
        tokens[i, 0] = BOS_ID
    model = tiny_model(20, word_dropout=p).train()
    torch.manual_seed(7)
    inputs = model.decoder_inputs(tokens)
    torch.manual_seed(7)
    draws = torch.rand(tokens[:, :-1].shape)
    original = tokens[:, :-1]
    position = torch.arange(original.size(1)).expand_as(original)
    replaced = (draws < p) & (position > 0) & (original != PAD_ID)
    assert replaced.any() and (~replaced & (original != PAD_ID) & (position > 0)).any()
    torch.testing.assert_close(inputs, torch.where(replaced, torch.full_like(original, UNK_ID), original), rtol=0, atol=0)
    assert torch.all(inputs[:, 0] == BOS_ID)


def test_word_dropout_rate_is_p():
    from seqvae.text.datamodule import BOS_ID, UNK_ID

    p = 0.25
    tokens = torch.randint(4, 50, (400, 30), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = BOS_ID
    model = tiny_model(50, word_dropout=p).train()
    torch.manual_seed(0)
    inputs = model.decoder_inputs(tokens)
    rate = (inputs[:, 1:] == UNK_ID).double().mean().item()  # 400 · 28 candidates
    sd = (p * (1 - p) / (400 * 28)) ** 0.5
    assert abs(rate - p) < 4 * sd, (rate, p)
    assert torch.all(inputs[:, 0] == BOS_ID)


def test_word_dropout_off_at_p_zero_and_in_eval_mode():
    tokens, _ = dropout_tokens()
    torch.manual_seed(0)
    assert torch.equal(tiny_model(20, word_dropout=0.0).train().decoder_inputs(tokens), tokens[:, :-1])
    assert torch.equal(tiny_model(20, word_dropout=0.9).eval().decoder_inputs(tokens), tokens[:, :-1])


def test_training_loss_reads_the_dropped_inputs():
    """rec of `loss_terms` is the decoder's NLL given the word-dropped inputs (targets intact)."""
    from seqvae.core.metrics import sample_posterior

    tokens, lengths = dropout_tokens()
    batch = {"tokens": tokens, "lengths": lengths}
    torch.manual_seed(0)
    model = tiny_model(20, word_dropout=0.5, dropout_in=0.0, dropout_out=0.0).train()
    with torch.no_grad():
        model.decoder.out.weight.normal_(0, 1.0)
        model.decoder.embed.weight.normal_(0, 1.0)  # unk reads differently from the word it replaces
        torch.manual_seed(3)
        rec = model.loss_terms(batch, 1.0)["rec"]
        torch.manual_seed(3)  # the same draws, in the same order: word dropout, then z
        inputs = model.decoder_inputs(tokens)
        mu, logvar, _ = model.encoder(tokens, lengths)
        z = sample_posterior(mu, logvar, 1)
        expected = -model.decoder.log_likelihood(tokens, lengths, z, inputs)[:, 0].mean()
        undropped = -model.decoder.log_likelihood(tokens, lengths, z)[:, 0].mean()
    assert not torch.equal(inputs, tokens[:, :-1])
    torch.testing.assert_close(rec, expected)
    assert abs(float(rec - undropped)) > 1e-3


# ---------------------------------------------------------------- perplexity denominators
@pytest.mark.parametrize("latent_dim", [4, 0])
def test_perplexities_are_per_predicted_token(corpus, tmp_path, latent_dim):
    """elbo_ppl = exp(Σ -ELBO / P) and iw_ppl = exp(Σ IW-NLL / P), P = Σ (words + 1): every
    word and `</s>` is predicted, `<s>` never is. Counted here from the raw text lines."""
    root, val = corpus
    test = (root / "test.txt").read_text().splitlines()
    dm = datamodule(root)
    pl.seed_everything(0)
    model = tiny_model(dm.vocab_size, latent_dim=latent_dim, val_iw_samples=2, test_iw_samples=3)
    t = trainer(tmp_path)
    for stage, lines, m in (
        ("test", test, t.test(model, dm, verbose=False)[0]),
        ("val", val, t.validate(model, dm, verbose=False)[0]),
    ):
        per_token = len(lines) / sum(len(line.split()) + 1 for line in lines)
        assert m[f"{stage}/elbo_ppl"] == pytest.approx(math.exp(m[f"{stage}/loss"] * per_token), rel=1e-4)
        assert m[f"{stage}/iw_ppl"] == pytest.approx(math.exp(m[f"{stage}/iw_nll"] * per_token), rel=1e-4)


# ---------------------------------------------------------------- IW-NLL, exact values at model level
def z_blind(model):
    """The decoder ignores z (no z in c0, z's input columns zero) and q(z|x) = N(0, I) = p(z)."""
    e = model.hparams.embed_dim
    with torch.no_grad():
        model.encoder.to_posterior.weight.zero_()
        model.decoder.z_to_c0.weight.zero_()
        model.decoder.lstm.weight_ih_l0[:, e:] = 0.0
        model.decoder.out.weight.normal_(0, 1.0)  # a non-uniform decoder
    return model


def test_iw_nll_at_model_level_is_the_exact_nll_when_every_weight_is_p_x(corpus):
    """Every importance weight is then p(x): IW-NLL must be -log p(x) for every K (the average
    of K equal weights is that weight; without the -log K it would be off by log K)."""
    root, val = corpus
    dm = datamodule(root)
    torch.manual_seed(0)
    model = z_blind(tiny_model(dm.vocab_size))
    model.vocab = dm.vocab
    exact = []
    with torch.no_grad():
        model.eval()
        for b in batches_of(model, val, 64):
            zeros = torch.zeros(b["tokens"].size(0), 1, 4)
            exact.append(-model.decoder.log_likelihood(b["tokens"], b["lengths"], zeros)[:, 0])
    exact = torch.cat(exact)
    assert exact.min() > 5  # nats: non-trivial values
    for k in (1, 2, 7, 40):
        torch.testing.assert_close(model.iw_nll(val, n_samples=k), exact, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(model.elbo(val), exact, rtol=1e-5, atol=1e-4)  # KL = 0 here


def test_iw_nll_at_model_level_equals_log_mean_exp_of_independent_weights(corpus):
    """Same global-RNG noise (all K·B·Z values per batch drawn at once): the weights log p(x|z)
    + log p(z) - log q(z|x) recomputed with torch.distributions, averaged in float64. K = 1 is
    the one-sample -ELBO with a sampled KL."""
    from torch.distributions import Normal

    root, val = corpus
    dm = datamodule(root)
    torch.manual_seed(0)
    model = tiny_model(dm.vocab_size).eval()
    model.vocab = dm.vocab
    with torch.no_grad():
        model.encoder.to_posterior.weight.normal_(0, 0.5)
        model.decoder.z_to_c0.weight.normal_(0, 2.0)
        model.decoder.out.weight.normal_(0, 1.0)
    for k in (1, 6):
        torch.manual_seed(11)
        got = model.iw_nll(val, n_samples=k, batch_size=8)
        torch.manual_seed(11)
        expected = []
        with torch.no_grad():
            for b in batches_of(model, val, 8):
                mu, logvar, _ = model.encoder(b["tokens"], b["lengths"])
                sd = (0.5 * logvar).exp()
                z = mu.unsqueeze(1) + sd.unsqueeze(1) * torch.randn(mu.size(0), k, mu.size(1))
                log_w = (
                    model.decoder.log_likelihood(b["tokens"], b["lengths"], z)
                    + Normal(0.0, 1.0).log_prob(z).sum(-1)
                    - Normal(mu.unsqueeze(1), sd.unsqueeze(1)).log_prob(z).sum(-1)
                ).double()
                top = log_w.max(1).values
                expected.append(-(top + ((log_w - top.unsqueeze(1)).exp().mean(1)).log()))
        expected = torch.cat(expected).float()
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("k", [1, 7])
def test_evaluation_iw_nll_is_the_exact_nll_when_every_weight_is_p_x(corpus, tmp_path, k):
    """The evaluation loop's IW-NLL (test/iw_nll) on the same constructed model: the mean exact
    NLL of the test texts, equal to test/loss (rec is exact and KL = 0 there), its Monte-Carlo
    standard error 0 (all K weights equal)."""
    root, _ = corpus
    test = (root / "test.txt").read_text().splitlines()
    dm = datamodule(root)
    torch.manual_seed(0)
    model = z_blind(tiny_model(dm.vocab_size, test_iw_samples=k))
    model.vocab = dm.vocab
    with torch.no_grad():
        model.eval()
        exact = torch.cat(
            [-model.decoder.log_likelihood(b["tokens"], b["lengths"], torch.zeros(len(b["lengths"]), 1, 4))[:, 0]
             for b in batches_of(model, test, 64)]
        )  # fmt: skip
    m = trainer(tmp_path).test(model, dm, verbose=False)[0]
    assert m["test/iw_nll"] == pytest.approx(float(exact.mean()), rel=1e-5)
    assert m["test/loss"] == pytest.approx(float(exact.mean()), rel=1e-5)
    if k > 1:
        assert m["test/iw_nll_se"] == pytest.approx(0.0, abs=1e-5)
