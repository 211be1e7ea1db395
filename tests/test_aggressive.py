"""Aggressive training (He et al. 2019), BN-VAE, and encoder pretraining (Li et al. 2019)."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from test_model import corpus, datamodule, tiny_model, trainer  # noqa: F401  (fixtures and helpers)

from seqvae import AggressiveTraining, ConstantKL, FreeBits, SeqVAE
from seqvae.core.aggressive import WindowStopRule
from seqvae.core.losses import gaussian_kl


def run_rule(per_word_losses, window=15, words=10):
    """Feeds a constructed per-step loss-per-word sequence; returns the step it stopped at."""
    rule = WindowStopRule(window)
    for step, loss in enumerate(per_word_losses, start=1):
        if rule.update(loss * words, words):
            return step
    return None


def test_window_rule_stops_at_first_window_whose_loss_rose():
    falling = [5.0 - 0.01 * i for i in range(200)]
    assert run_rule(falling) is None  # never rises: the caller's cap (99) ends the loop
    # windows 1 and 2 fall, window 3 (steps 31-45) is worse than window 2 -> stop at 45
    seq = [3.0] * 15 + [2.0] * 15 + [2.5] * 15 + [1.0] * 60
    assert run_rule(seq) == 45
    # the first window is compared with 1e4, so it never stops at 15
    assert run_rule([50.0] * 15 + [60.0] * 15) == 30
    # equal loss is not a rise
    assert run_rule([2.0] * 90) is None


def test_inner_loop_never_exceeds_cap_and_stops_on_window_boundaries(corpus, tmp_path):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    pl.seed_everything(0)
    model = tiny_model(dm.vocab_size, aggressive=AggressiveTraining(max_inner_steps=99))
    steps = []
    original = model.aggressive.train_encoder
    model.aggressive.train_encoder = lambda m, b, w: steps.append(original(m, b, w)) or steps[-1]
    trainer(tmp_path, limit_train_batches=3, limit_val_batches=0).fit(model, dm)
    assert len(steps) == 3
    assert all(s in (30, 45, 60, 75, 90, 99) for s in steps)
    assert model.encoder_updates == sum(steps) and model.decoder_updates == 3 and model.num_updates == 3


def test_encoder_only_and_decoder_only_steps_leave_the_other_bit_identical(corpus, tmp_path):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size)
    t = trainer(tmp_path, limit_train_batches=1, limit_val_batches=0)
    t.fit(model, dm)  # attaches optimisers
    batch = next(iter(dm.train_dataloader()))
    for stepped, other in ((model.encoder, model.decoder), (model.decoder, model.encoder)):
        before_s = [p.detach().clone() for p in stepped.parameters()]
        before_o = [p.detach().clone() for p in other.parameters()]
        model.update_step(batch, 1.0, stepped=stepped)
        assert all(torch.equal(a, b) for a, b in zip(before_o, other.parameters()))
        assert all(not torch.equal(a, b) for a, b in zip(before_s, stepped.parameters()))
        frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
        assert frozen == set(), frozen  # every trainable parameter unfrozen again


def test_encoder_step_gradients_equal_full_backward(corpus):  # noqa: F811
    """Skipping decoder weight gradients does not change the encoder's gradients."""
    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size).eval()  # eval: no dropout, same computation twice
    batch = next(iter(dm.train_dataloader()))
    torch.manual_seed(3)
    model.loss_terms(batch, 0.7)["loss"].backward()
    full = [p.grad.clone() for p in model.encoder.parameters()]
    model.zero_grad()
    for p in model.decoder.parameters():
        p.requires_grad_(False)
    torch.manual_seed(3)
    model.loss_terms(batch, 0.7)["loss"].backward()
    for a, p in zip(full, model.encoder.parameters()):
        torch.testing.assert_close(a, p.grad)
    assert all(p.grad is None for p in model.decoder.parameters())


@pytest.mark.parametrize("clip_joint", [False, True])
def test_one_module_step_is_sgd_on_the_clipped_gradient(corpus, tmp_path, clip_joint):  # noqa: F811
    """An encoder-only step is w - lr * g_enc * min(1, clip / |g|), where |g| is the norm of the
    encoder's gradients alone, or (clip_joint, the reference) of encoder AND decoder gradients;
    the decoder stays bit-identical either way."""
    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size)
    trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, dm)  # attaches optimisers
    model.eval()  # no dropout: the same computation twice
    batch = next(iter(dm.train_dataloader()))
    torch.manual_seed(5)
    model.zero_grad()
    model.loss_terms(batch, 0.7)["loss"].backward()
    enc_grads = [p.grad.clone() for p in model.encoder.parameters()]

    def norm(params):
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))

    clip = 0.5 * norm(model.encoder.parameters())  # bites in both modes (the joint norm is larger)
    model.hparams.grad_clip = clip
    scale = clip / (norm(model.parameters() if clip_joint else model.encoder.parameters()) + 1e-6)
    expected = [p.detach() - model.hparams.lr * scale * g for p, g in zip(model.encoder.parameters(), enc_grads)]
    decoder_before = [p.detach().clone() for p in model.decoder.parameters()]
    model.zero_grad()
    torch.manual_seed(5)
    model.update_step(batch, 0.7, stepped=model.encoder, clip_joint=clip_joint)
    for e, p in zip(expected, model.encoder.parameters()):
        torch.testing.assert_close(p.detach(), e)
    assert all(torch.equal(a, b) for a, b in zip(decoder_before, model.decoder.parameters()))


def test_aggressive_clip_option_is_checked_and_survives_pickling():
    import pickle

    assert pickle.loads(pickle.dumps(AggressiveTraining(clip="joint"))).clip == "joint"
    with pytest.raises(ValueError, match="model.aggressive.clip"):
        AggressiveTraining(clip="decoder")


def test_mi_switch_off_fires_once_and_survives_save_and_resume(corpus, tmp_path):  # noqa: F811
    agg = AggressiveTraining()
    assert agg.end_epoch(0.5) is False and agg.active
    assert agg.end_epoch(0.7) is False and agg.active
    assert agg.end_epoch(0.6) is True and not agg.active
    assert agg.end_epoch(0.1) is False and not agg.active  # stays off
    assert agg.end_epoch(5.0) is False and not agg.active
    fresh = AggressiveTraining()
    fresh.load_state_dict(agg.state_dict())
    assert not fresh.active and fresh.previous_mi == 0.6
    # through a real checkpoint: hparams keep the configuration, the checkpoint the state
    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size, aggressive=AggressiveTraining(max_inner_steps=5))
    t = trainer(tmp_path, limit_train_batches=2, limit_val_batches=0)
    t.fit(model, dm)
    model.aggressive.end_epoch(-1.0)
    rng_state = model.aggressive.rng.getstate()
    t.save_checkpoint(tmp_path / "a.ckpt")
    loaded = SeqVAE.load_from_checkpoint(tmp_path / "a.ckpt")  # weights_only loading works
    assert loaded.aggressive.active is False and loaded.aggressive.previous_mi == -1.0
    assert loaded.aggressive.rng.getstate() == rng_state
    assert (loaded.encoder_updates, loaded.decoder_updates) == (model.encoder_updates, model.decoder_updates)


def test_plain_training_counts_one_update_each(corpus, tmp_path):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size)
    trainer(tmp_path, limit_train_batches=3, limit_val_batches=0).fit(model, dm)
    assert (model.num_updates, model.encoder_updates, model.decoder_updates) == (3, 3, 3)


@pytest.mark.parametrize("gamma", [0.3, 0.7])
def test_bn_vae_batch_kl_at_least_its_lower_bound(corpus, gamma):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    torch.manual_seed(0)
    model = tiny_model(dm.vocab_size, bn_gamma=gamma)
    model.encoder.to_posterior.weight.data.normal_(0, 0.01)  # nearly collapsed means before BN
    model.encoder.mean_norm.bias.data.normal_(0, 0.2)  # some learned shift β
    batch = next(iter(dm.train_dataloader()))
    model.train()
    mu, logvar, _ = model.encoder(batch["tokens"], batch["lengths"])
    kl = gaussian_kl(mu, logvar).sum(-1).mean()
    bn = model.encoder.mean_norm
    # With batch statistics E_b[mu_d²] = γ² v/(v+eps) + β_d² (v the batch variance), and
    # σ² - log σ² - 1 ≥ 0, so E_b[KL] ≥ ½ Σ_d (γ² v/(v+eps) + β_d²) ≥ ... ≈ Z γ²/2.
    pre = model.encoder.to_posterior(model.encoder.features(batch["tokens"], batch["lengths"]))[:, :4]
    v = pre.var(0, unbiased=False)
    bound = 0.5 * (gamma**2 * v / (v + bn.eps) + bn.bias**2).sum()
    assert kl >= bound - 1e-5
    torch.testing.assert_close(torch.mean(mu**2, 0), gamma**2 * v / (v + bn.eps) + bn.bias**2, rtol=1e-4, atol=1e-6)
    assert not bn.weight.requires_grad and bn.bias.requires_grad


def test_bn_vae_bound_needs_batch_variance_above_eps(corpus):  # noqa: F811
    # Raw means whose batch variance v is ≪ 1e-5 (nearly identical documents): with the default
    # ε = 1e-5 BatchNorm shrinks them to a spread of γ²·v/(v+ε) ≪ γ², and the KL bound is gone;
    # with bn_eps ≪ v it holds again. (The yahoo10k BN-VAE run escaped its bound this way.)
    root, _ = corpus
    dm = datamodule(root)
    batch = max(dm.train_dataloader(), key=lambda b: len(b["lengths"]))  # buckets vary in size
    gamma, z = 0.6, 4
    kls = {}
    for eps in (1e-5, 1e-12):
        torch.manual_seed(0)
        model = tiny_model(dm.vocab_size, bn_gamma=gamma, bn_eps=eps)
        # The untrained tiny encoder's features barely vary across texts: with these weights
        # the raw means have a batch variance of ~1e-8..1e-6 (asserted below).
        model.encoder.to_posterior.weight.data.normal_(0, 1.0)
        model.train()
        with torch.no_grad():
            raw = model.encoder.to_posterior(model.encoder.features(batch["tokens"], batch["lengths"]))[:, :z]
            mu, logvar, _ = model.encoder(batch["tokens"], batch["lengths"])
        v = raw.var(0, unbiased=False)
        assert len(v) == z and 1e-9 < v.min() and v.max() < 1e-6  # the constructed regime: v well below the default ε
        torch.testing.assert_close(mu.pow(2).mean(0), gamma**2 * v / (v + eps), rtol=1e-3, atol=1e-9)
        kls[eps] = gaussian_kl(mu, logvar).sum(-1).mean().item()
    bound = z * gamma**2 / 2
    assert kls[1e-5] < 0.2 * bound <= bound - 1e-3 < kls[1e-12]


def test_encoder_pretraining_keeps_encoder_and_fresh_decoder(corpus, tmp_path):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    pl.seed_everything(0)
    ae = tiny_model(dm.vocab_size, kl_schedule=ConstantKL(0.0))
    t = trainer(tmp_path, limit_train_batches=3, limit_val_batches=0)
    t.fit(ae, dm)
    t.save_checkpoint(tmp_path / "ae.ckpt")
    pl.seed_everything(5)
    fresh_decoder = {k: v.clone() for k, v in tiny_model(dm.vocab_size).decoder.state_dict().items()}
    pl.seed_everything(5)
    vae = tiny_model(dm.vocab_size, init_encoder_from=str(tmp_path / "ae.ckpt"), kl_penalty=FreeBits(2.0))
    seen = {}

    class Capture(pl.Callback):  # state after setup, before the first update
        def on_train_start(self, trainer, module):
            seen["encoder"] = {k: v.clone() for k, v in module.encoder.state_dict().items()}
            seen["decoder"] = {k: v.clone() for k, v in module.decoder.state_dict().items()}

    trainer(tmp_path, limit_train_batches=3, limit_val_batches=0, callbacks=[Capture()]).fit(vae, dm)
    for k, v in ae.encoder.state_dict().items():
        assert torch.equal(seen["encoder"][k], v), k
    for k, v in fresh_decoder.items():
        assert torch.equal(seen["decoder"][k], v), k
    # and training moved every parameter from there, the loaded encoder included
    start = {f"encoder.{k}": v for k, v in seen["encoder"].items()} | {f"decoder.{k}": v for k, v in seen["decoder"].items()}
    assert [n for n, p in vae.named_parameters() if torch.equal(p, start[n])] == []


def test_encoder_pretraining_refuses_another_width_or_vocabulary_in_one_line(corpus, tmp_path):  # noqa: F811
    from test_model import write_corpus

    from seqvae.core.model import pretrained_encoder
    from seqvae.text.datamodule import ConfigError

    root, _ = corpus
    dm = datamodule(root)
    ae = tiny_model(dm.vocab_size, kl_schedule=ConstantKL(0.0))
    t = trainer(tmp_path, limit_train_batches=1, limit_val_batches=0)
    t.fit(ae, dm)
    t.save_checkpoint(tmp_path / "ae.ckpt")
    path = str(tmp_path / "ae.ckpt")
    state = pretrained_encoder(path, tiny_model(dm.vocab_size).encoder, dm.vocab)
    assert all(torch.equal(state[k], v) for k, v in ae.encoder.state_dict().items())
    wider = tiny_model(dm.vocab_size, encoder_hidden_dim=16, init_encoder_from=path)
    shapes = r"encoder.lstm.weight_ih_l0 is \(48, 8\) there, \(64, 8\) here"
    with pytest.raises(ConfigError, match=r"^model.init_encoder_from: .*ae.ckpt: " + shapes):
        trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(wider, dm)
    # the same sizes, other words: the embeddings would be read as other words' vectors
    other = tmp_path / "other"
    other.mkdir()
    for name, seed in (("train.txt", 7), ("valid.txt", 8), ("test.txt", 9)):
        write_corpus(other / name, 60, seed)
    (other / "train.txt").write_text((other / "train.txt").read_text().replace("cat", "kitten"))
    dm2 = datamodule(other)
    dm2.setup("fit")
    assert len(dm2.vocab) == len(dm.vocab) and dm2.vocab.tokenizer.get_vocab() != dm.vocab.tokenizer.get_vocab()
    with pytest.raises(ConfigError, match=r"^model.init_encoder_from: .*ae.ckpt was trained with another vocabulary"):
        pretrained_encoder(path, tiny_model(dm2.vocab_size).encoder, dm2.vocab)


def test_bn_vae_single_sentence_batch_uses_running_statistics(corpus):  # noqa: F811
    # Equal-length buckets can hold one sentence; BatchNorm has no batch variance for it.
    root, _ = corpus
    dm = datamodule(root)
    torch.manual_seed(0)
    model = tiny_model(dm.vocab_size, bn_gamma=0.5)
    batch = next(iter(dm.train_dataloader()))
    one = {"tokens": batch["tokens"][:1], "lengths": batch["lengths"][:1]}
    bn = model.encoder.mean_norm
    bn.running_mean.normal_(0, 0.1)
    stats = (bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked))
    model.train()
    mu_train, _, _ = model.encoder(one["tokens"], one["lengths"])
    assert torch.equal(bn.running_mean, stats[0]) and torch.equal(bn.running_var, stats[1])
    assert int(bn.num_batches_tracked) == stats[2]
    model.eval()
    mu_eval, _, _ = model.encoder(one["tokens"], one["lengths"])
    torch.testing.assert_close(mu_train, mu_eval, rtol=0, atol=0)
    model.train()
    mu_batch, _, _ = model.encoder(batch["tokens"], batch["lengths"])  # a real batch still updates them
    assert not torch.equal(bn.running_mean, stats[0]) and mu_batch.requires_grad


@pytest.mark.parametrize("kind", ["plain", "encoder", "decoder", "joint"])
def test_parameters_frozen_at_construction_stay_frozen_and_unchanged(corpus, tmp_path, kind):  # noqa: F811
    """BN-VAE's γ is frozen on purpose (it is the KL floor Z·γ²/2). A one-module step freezes the
    other module and must give each parameter its own requires_grad back, not True: γ stays
    frozen and bit-identical through plain, encoder-only, decoder-only and joint-clipped steps,
    while the trainable parameters next to it do move."""
    root, _ = corpus
    dm = datamodule(root)
    torch.manual_seed(0)
    model = tiny_model(dm.vocab_size, bn_gamma=0.6)
    trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, dm)  # attaches optimisers
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert set(frozen) == {"encoder.mean_norm.weight"}
    gamma = model.encoder.mean_norm.weight
    torch.testing.assert_close(gamma, torch.full_like(gamma, 0.6))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    stepped = {"plain": None, "encoder": model.encoder, "decoder": model.decoder, "joint": model.encoder}[kind]
    batches = iter(dm.train_dataloader())
    for _ in range(3):
        model.update_step(next(batches), 1.0, stepped=stepped, clip_joint=kind == "joint")
    for n, p in model.named_parameters():
        if n in frozen:
            assert not p.requires_grad, n
            assert torch.equal(p, frozen[n]), n
        else:
            assert p.requires_grad, n
    moved = {n for n, p in model.named_parameters() if n in before and not torch.equal(p, before[n])}
    assert "encoder.mean_norm.bias" in moved or kind == "decoder"  # β trains beside the frozen γ
