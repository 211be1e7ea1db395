"""The training step and aggressive training's inner loop, pinned call by call.

A spy wraps `SeqVAE.update_step` and records every optimiser update: the batch it was given,
the KL weight and which module it stepped. Each test then checks the sequence of updates of a
real (tiny) fit against what He et al.'s Algorithm 1 prescribes: for every training batch X,
encoder-only updates on X first and then on uniformly drawn training batches, all with the KL
schedule's weight of that update, then one decoder-only update on X; aggressive mode ends at
the first epoch whose validation MI (per-batch estimator, `val/mi`) dropped.

The inner loop is also driven without Lightning (`FakeModule`): constructed batch sizes,
lengths and losses pin the stop rule's loss-per-word arithmetic exactly.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from test_model import corpus, datamodule, tiny_model, trainer  # noqa: F401  (fixtures and helpers)

from seqvae import AggressiveTraining, ConstantKL
from seqvae.core.aggressive import WindowStopRule
from seqvae.core.schedules import LinearKLWarmup


# ---------------------------------------------------------------- spies
class UpdateSpy:
    """Wraps `model.update_step`; records (tokens, lengths, kl_weight, stepped, clip_joint) of every call."""

    def __init__(self, model):
        self.model, self.calls, self.original = model, [], model.update_step
        model.update_step = self

    def __call__(self, batch, kl_weight, stepped=None, clip_joint=False):
        name = {id(self.model.encoder): "encoder", id(self.model.decoder): "decoder", id(None): "all"}[id(stepped)]
        self.calls.append(
            SimpleNamespace(
                tokens=batch["tokens"].clone(), lengths=batch["lengths"].clone(), w=kl_weight, stepped=name, joint=clip_joint
            )
        )
        return self.original(batch, kl_weight, stepped=stepped, clip_joint=clip_joint)


class BatchRecorder(pl.Callback):
    """The training batches in the order the loop hands them to `training_step`."""

    def __init__(self):
        self.batches = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches.append((batch["tokens"].clone(), batch["lengths"].clone()))


def record_random_batches(dm):
    """Wraps `dm.random_train_batch`; returns the list of the batches it handed out."""
    drawn, original = [], dm.random_train_batch

    def spy(generator):
        batch = original(generator)
        drawn.append((batch["tokens"].clone(), batch["lengths"].clone()))
        return batch

    dm.random_train_batch = spy
    return drawn


def same(call, batch):
    tokens, lengths = batch
    return torch.equal(call.tokens, tokens) and torch.equal(call.lengths, lengths)


def warmup_weight(update, n_batches, start=0.1, epochs=10):
    """LinearKLWarmup's weight for outer update `update`, written out (SPEC §3)."""
    return min(1.0, start + (1.0 - start) / (epochs * n_batches) * (update + 1))


# ---------------------------------------------------------------- the training step in a real fit
@pytest.mark.parametrize("clip", ["stepped", "joint"])
def test_aggressive_updates_in_order_on_the_right_batches_with_the_schedule_weight(corpus, tmp_path, clip):  # noqa: F811
    """Per training batch X: K encoder-only updates (the first on X itself, the next K-1 on the
    random batches drawn for them, nothing else drawn), then ONE decoder-only update on X; every
    one of them with the KL weight of this outer update (not 1.0, not the next update's)."""
    root, _ = corpus
    dm = datamodule(root)
    drawn = record_random_batches(dm)
    pl.seed_everything(0)
    inner = 3  # window 15 never fires within 3 steps: exactly 3 encoder updates per batch
    model = tiny_model(dm.vocab_size, aggressive=AggressiveTraining(max_inner_steps=inner, clip=clip))
    spy, seen = UpdateSpy(model), BatchRecorder()
    n_batches = 4
    trainer(tmp_path, limit_train_batches=n_batches, limit_val_batches=0, callbacks=[seen]).fit(model, dm)

    assert len(seen.batches) == n_batches
    assert len(spy.calls) == n_batches * (inner + 1)
    assert len(drawn) == n_batches * (inner - 1)  # one draw per inner step after the first: none for X, none for the decoder
    for u, batch in enumerate(seen.batches):
        calls = spy.calls[u * (inner + 1) : (u + 1) * (inner + 1)]
        assert [c.stepped for c in calls] == ["encoder"] * inner + ["decoder"]
        assert [c.joint for c in calls] == [clip == "joint"] * (inner + 1)
        assert same(calls[0], batch), f"update {u}: the first encoder step is not on the training batch"
        for c, random_batch in zip(calls[1:inner], drawn[u * (inner - 1) : (u + 1) * (inner - 1)]):
            assert same(c, random_batch)
        assert same(calls[-1], batch), f"update {u}: the decoder step is not on the training batch"
        w = warmup_weight(u, n_batches)
        assert w < 0.2  # far from 1: a step that used 1.0 would show
        assert [c.w for c in calls] == pytest.approx([w] * (inner + 1), rel=1e-12)
    assert (model.num_updates, model.encoder_updates, model.decoder_updates) == (n_batches, n_batches * inner, n_batches)


def test_plain_training_is_one_joint_update_per_batch_with_the_schedule_weight(corpus, tmp_path):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    drawn = record_random_batches(dm)
    pl.seed_everything(0)
    model = tiny_model(dm.vocab_size)
    spy, seen = UpdateSpy(model), BatchRecorder()
    trainer(tmp_path, max_epochs=2, limit_train_batches=3, limit_val_batches=0, callbacks=[seen]).fit(model, dm)
    assert len(seen.batches) == len(spy.calls) == 6 and drawn == []
    for u, (call, batch) in enumerate(zip(spy.calls, seen.batches)):
        assert call.stepped == "all" and not call.joint and same(call, batch)
        assert call.w == pytest.approx(warmup_weight(u, 3), rel=1e-12)  # the counter runs on across epochs


def test_constant_kl_weight_reaches_every_inner_step(corpus, tmp_path):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    pl.seed_everything(0)
    model = tiny_model(dm.vocab_size, kl_schedule=ConstantKL(0.37), aggressive=AggressiveTraining(max_inner_steps=4))
    spy = UpdateSpy(model)
    trainer(tmp_path, limit_train_batches=2, limit_val_batches=0).fit(model, dm)
    assert [c.w for c in spy.calls] == [0.37] * 10


def test_mi_switch_off_reads_the_per_batch_mi_not_the_dataset_mi(corpus, tmp_path):  # noqa: F811
    """Constructed validation values: val/mi falls after epoch 1 while val/mi_dataset rises, so
    aggressive mode must end after epoch 1 (and epoch 2 trains with plain joint updates); read
    from mi_dataset it would have stayed on through epoch 2."""
    root, _ = corpus
    dm = datamodule(root)
    pl.seed_everything(0)
    model = tiny_model(dm.vocab_size, aggressive=AggressiveTraining(max_inner_steps=2))
    mi = iter([0.5, 0.3, 0.9])
    mi_dataset = iter([0.1, 0.6, 0.2])
    real_compute = model.val_metrics.compute
    model.val_metrics.compute = lambda: {
        **real_compute(),
        "mi": torch.tensor(next(mi)),
        "mi_dataset": torch.tensor(next(mi_dataset)),
    }
    fed = []
    real_end_epoch = model.aggressive.end_epoch
    model.aggressive.end_epoch = lambda value: (fed.append(value), real_end_epoch(value))[1]
    spy = UpdateSpy(model)
    t = trainer(tmp_path, max_epochs=3, limit_train_batches=2, limit_val_batches=1)
    t.fit(model, dm)
    assert fed == pytest.approx([0.5, 0.3])  # epoch 0: 0.5 ≥ 0 stays on; epoch 1: 0.3 < 0.5 ends it; then no more calls
    assert model.aggressive.active is False and model.aggressive.previous_mi == pytest.approx(0.3)
    per_epoch = [[c.stepped for c in spy.calls[i : i + 6]] for i in (0, 6, 12)]
    assert per_epoch[0] == per_epoch[1] == ["encoder", "encoder", "decoder"] * 2
    assert spy.calls[12:] and [c.stepped for c in spy.calls[12:]] == ["all", "all"]
    assert t.callback_metrics["train/aggressive"] == 0.0


# ---------------------------------------------------------------- the inner loop without Lightning
def make_batch(lengths, marker):
    """A batch of len(lengths) texts; `marker` in every token position tells batches apart."""
    lengths = torch.tensor(lengths)
    return {"tokens": torch.full((len(lengths), int(lengths.max())), marker), "lengths": lengths}


class FakeDataModule:
    def __init__(self, batches):
        self.batches, self.generators = list(batches), []

    def random_train_batch(self, generator):
        self.generators.append(generator)
        return self.batches.pop(0)


class FakeModule:
    """What `AggressiveTraining.train_encoder` uses of a SeqVAE: an encoder, a device, the
    datamodule's random batches and `update_step`, which here returns scripted mean losses."""

    def __init__(self, random_batches, losses):
        self.encoder, self.decoder, self.device = object(), object(), torch.device("cpu")
        self.trainer = SimpleNamespace(datamodule=FakeDataModule(random_batches))
        self.losses, self.calls = list(losses), []

    def update_step(self, batch, kl_weight, stepped=None, clip_joint=False):
        self.calls.append((batch, kl_weight, stepped, clip_joint))
        return {"loss": torch.tensor(self.losses.pop(0), dtype=torch.float64), "rec": torch.tensor(-1.0)}


# Window 2. Per step: (lengths of the texts, mean loss per text). Words = Σ(length - 1) (the
# predicted tokens: n words and </s>), loss = mean · texts.
#   window 1: (1·20 + 4·4) / (10 + 4·2)      = 36 / 18   = 2.000   < 1e4  -> go on
#   window 2: (1·16 + 1·19.5) / (8 + 10)     = 35.5 / 18 = 1.972   < 2.0  -> go on
#   window 3: (2·12 + 2·9) / (2·5 + 2·4)     = 42 / 18   = 2.333   > 1.97 -> stop at step 6
# Summing mean losses instead (24/18, 35.5/18) or counting <s> as a word (36/23, 35.5/20)
# would stop at step 4.
SCRIPT = [([11], 20.0), ([3, 3, 3, 3], 4.0), ([9], 16.0), ([11], 19.5), ([6, 6], 12.0), ([5, 5], 9.0)]


def scripted(script, extra_random=3, extra_losses=3):
    current = make_batch(script[0][0], marker=100)
    randoms = [make_batch(lengths, marker=101 + i) for i, (lengths, _) in enumerate(script[1:])]
    randoms += [make_batch([4], marker=200 + i) for i in range(extra_random)]
    losses = [loss for _, loss in script] + [1e3] * extra_losses
    return current, FakeModule(randoms, losses)


@pytest.mark.parametrize("clip", ["stepped", "joint"])
def test_inner_loop_batches_weights_and_window_arithmetic(clip):
    current, module = scripted(SCRIPT)
    agg = AggressiveTraining(max_inner_steps=10, window=2, clip=clip)
    steps = agg.train_encoder(module, current, 0.42)
    assert steps == 6 == len(module.calls)
    batches = [c[0] for c in module.calls]
    assert batches[0] is current  # the first encoder update is on the training batch itself
    assert [int(b["tokens"][0, 0]) for b in batches] == [100, 101, 102, 103, 104, 105]
    assert all(c[1] == 0.42 for c in module.calls)  # the caller's weight, unchanged, every step
    assert all(c[2] is module.encoder for c in module.calls)
    assert all(c[3] is (clip == "joint") for c in module.calls)
    dm = module.trainer.datamodule
    assert len(dm.generators) == 5 and all(g is agg.rng for g in dm.generators)  # no draw after the last step


def test_inner_loop_stops_at_the_cap_without_an_extra_draw():
    current, module = scripted([([5], 3.0)] * 5, extra_losses=0)  # falling is not needed: the cap ends it
    agg = AggressiveTraining(max_inner_steps=5, window=15)
    assert agg.train_encoder(module, current, 0.1) == 5
    assert len(module.calls) == 5 and len(module.trainer.datamodule.generators) == 4
    current, module = scripted([([5], 3.0)])
    assert AggressiveTraining(max_inner_steps=1).train_encoder(module, current, 0.1) == 1
    assert len(module.calls) == 1 and module.trainer.datamodule.generators == []


def test_inner_loop_equal_windows_go_on_and_a_rise_stops_at_the_window_end():
    # window 3, every step 1 text of 5 words (length 6): equal per-word loss is not a rise
    flat = [([6], 10.0)] * 9
    current, module = scripted(flat)
    assert AggressiveTraining(max_inner_steps=9, window=3).train_encoder(module, current, 0.5) == 9
    # first window 2.0/word, second 2.2/word: stop at step 6, not at the step that rose (4)
    current, module = scripted([([6], 10.0)] * 3 + [([6], 12.0), ([6], 10.0), ([6], 11.0)])
    assert AggressiveTraining(max_inner_steps=20, window=3).train_encoder(module, current, 0.5) == 6
    # the first window is compared with 1e4: a huge first window still goes on
    current, module = scripted([([2], 9e3)] * 2 + [([2], 9.5e3)] * 2)
    assert AggressiveTraining(max_inner_steps=20, window=2).train_encoder(module, current, 0.5) == 4


def test_window_rule_values_exactly():
    rule = WindowStopRule(window=2)
    assert rule.previous == 1e4 and rule.steps == 0
    assert rule.update(torch.tensor(36.0), torch.tensor(10)) is False
    assert rule.update(0.0, 8) is False
    assert rule.previous == pytest.approx(2.0) and rule.loss_sum == 0.0 and rule.words == 0
    assert rule.update(19.0, 9) is False and rule.loss_sum == 19.0 and rule.words == 9
    assert rule.update(17.0, 9) is False  # 36 / 18 = 2.0: equal is not a rise
    assert rule.update(19.0, 9) is False and rule.update(19.5, 9) is True  # 38.5 / 18 > 2.0


def test_inner_loop_defaults_are_he_et_al_s():
    """99 encoder updates at most (the reference's `sub_iter < 100`), windows of 15 steps."""
    per_word = [5.0 - 0.01 * i for i in range(120)]  # always falling: only the cap stops it
    current, module = scripted([([6], 5 * x) for x in per_word], extra_random=0, extra_losses=0)
    assert AggressiveTraining().train_encoder(module, current, 0.3) == 99 == len(module.calls)
    rule = WindowStopRule()
    rises = [([6], 10.0)] * 15 + [([6], 11.0)] * 15  # window 2 rose: stop at its end, step 30
    assert [rule.update(loss, 5) for _, loss in rises].index(True) == 29


def test_inner_loop_with_a_cap_of_zero_makes_no_update():
    current, module = scripted([([6], 10.0)])
    assert AggressiveTraining(max_inner_steps=0).train_encoder(module, current, 0.3) == 0
    assert module.calls == [] and module.trainer.datamodule.generators == []


def test_inner_batches_move_to_the_module_device():
    """The datamodule's random batches are CPU tensors; the encoder update gets them on the
    model's device (here the `meta` device stands in for a GPU)."""
    current, module = scripted([([6], 10.0)] * 3, extra_losses=0)
    module.device = torch.device("meta")
    AggressiveTraining(max_inner_steps=3).train_encoder(module, current, 0.3)
    assert [c[0]["tokens"].device.type for c in module.calls] == ["cpu", "meta", "meta"]
    assert all(c[0]["lengths"].device.type == "meta" for c in module.calls[1:])


def test_inner_batch_seed_explicit_wins_and_defaults_to_the_run_seed(monkeypatch):
    def draws(rng):
        return [rng.random() for _ in range(3)]

    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    explicit = AggressiveTraining(seed=3)
    assert explicit.seed == 3 and draws(explicit.rng) == draws(random.Random(3))
    default = AggressiveTraining()
    assert default.seed == 7 and draws(default.rng) == draws(random.Random(7))
    monkeypatch.delenv("PL_GLOBAL_SEED")
    unset = AggressiveTraining()
    assert unset.seed == 0 and draws(unset.rng) == draws(random.Random(0))


def test_mi_switch_off_needs_a_strict_drop():
    agg = AggressiveTraining(seed=0)
    assert agg.end_epoch(0.0) is False and agg.active  # equal to the reference's start value 0
    assert agg.end_epoch(0.4) is False and agg.end_epoch(0.4) is False and agg.active  # equal: no drop
    assert agg.end_epoch(0.4 - 1e-9) is True and not agg.active


# ---------------------------------------------------------------- survivors of the mutation run (docs/mutation.md)
def test_schedule_defaults():
    from seqvae.core.schedules import CyclicalKL

    assert ConstantKL().weight(5, 10, 3) == 1.0  # the plain VAE
    # LinearKLWarmup(): 0.1 rising over 10 epochs (He et al.)
    assert [LinearKLWarmup().weight(u, 3, 50) for u in (0, 28, 29)] == pytest.approx([0.13, 0.97, 1.0], abs=1e-12)
    # CyclicalKL(): 4 cycles, rising over the first half of each (Fu et al.): 40 updates, period 10
    weights = [CyclicalKL().weight(u, 10, 4) for u in range(40)]
    assert weights == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0] * 4, abs=1e-12)


def test_kl_penalty_defaults_and_non_square_batches():
    """Free-bits targets default to 8 nats (Li et al.; Kingma et al.); λ = target / Z, Z the
    LAST dimension, and BatchFreeBits returns one value per sentence (B of them), on a batch
    with B ≠ Z."""
    from seqvae.core.losses import BatchFreeBits, FreeBits

    # B = 2 sentences, Z = 4 dims: λ = 8 / 4 = 2 (by B it would be 4; a target of 9 gives 2.25)
    kl = torch.tensor([[1.0, 2.1, 3.0, 5.0], [2.0, 0.5, 4.5, 1.5]])
    torch.testing.assert_close(FreeBits()(kl), torch.tensor([2.1 + 3.0 + 5.0, 4.5]))
    # batch means 1.5, 1.3, 3.75, 3.25 -> max(λ = 2, ·) = 2, 2, 3.75, 3.25: 11.0 for each of the 2 sentences
    torch.testing.assert_close(BatchFreeBits()(kl), torch.tensor([11.0, 11.0]))
    kl3 = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5], [0.5, 0.4, 0.3, 0.2, 0.1], [3.0, 0.0, 0.0, 0.0, 0.0]])
    # Z = 5, target 1 -> λ = 0.2 (by B = 3 it would be 0.333); means 1.2, 0.2, 0.2, 0.2, 0.2
    torch.testing.assert_close(BatchFreeBits(target=1.0)(kl3), torch.full((3,), 2.0))


def test_cosine_dispersion_default_weight_and_two_sentence_batch():
    from seqvae.core.losses import CosineDispersion

    h = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    cos = 1 / 2**0.5  # one pair, both orders
    assert float(CosineDispersion()(h)) == pytest.approx(cos, abs=1e-12)
    assert float(CosineDispersion(3.0)(h)) == pytest.approx(3 * cos, abs=1e-12)
    assert float(CosineDispersion()(h[:1])) == 0.0


# metrics.py survivors. Exact values on constructed inputs; `two_ranks` stands in for a 2-process
# DDP gather (each rank holding the same states), which exercises every state's reduction.
F64 = torch.float64


def test_sample_posterior_draws_on_the_posterior_device():
    from seqvae.core.metrics import sample_posterior

    mu, logvar = torch.zeros(3, 2, device="meta"), torch.zeros(3, 2, device="meta")
    z = sample_posterior(mu, logvar, 5)
    assert z.device.type == "meta" and z.shape == (3, 5, 2)


def test_mutual_information_passes_its_memory_budget_on(monkeypatch):
    from seqvae.core import metrics

    seen = []
    real = metrics.log_aggregate_posterior

    def spy(z, mu, logvar, budget):
        seen.append(budget)
        return real(z, mu, logvar, budget)

    monkeypatch.setattr(metrics, "log_aggregate_posterior", spy)
    mu, logvar = torch.zeros(6, 2, dtype=F64), torch.zeros(6, 2, dtype=F64)
    metrics.mutual_information(mu, logvar, torch.Generator().manual_seed(0), max_elements=12)
    assert seen == [12]


def test_active_units_counts_a_variance_equal_to_the_threshold():
    from seqvae.core.metrics import active_units

    # two texts; variances (divisor N-1): 0.5 exactly (values 0 and 1), 0.49005, 0, 0
    mu = torch.tensor([[0.0, 0.0, 0.0, 3.0], [1.0, 0.99, 0.0, 3.0]], dtype=F64)
    assert int(active_units(mu.sum(0), (mu**2).sum(0), 2, threshold=0.5)) == 1


def test_covariance_from_sums_is_the_sample_covariance():
    from seqvae.core.metrics import covariance_from_sums

    x = torch.tensor([[1.0, 2.0, 0.0], [3.0, -1.0, 1.0], [0.0, 0.5, 4.0], [2.0, 2.0, 2.0]], dtype=F64)
    got = covariance_from_sums(x.sum(0), x.T @ x, 4)
    torch.testing.assert_close(got, torch.cov(x.T, correction=1), rtol=1e-12, atol=1e-12)
    # one coordinate by hand: mean 1.5, squared deviations 0.25 + 2.25 + 2.25 + 0.25 = 5, / 3
    assert float(got[0, 0]) == pytest.approx(5 / 3, abs=1e-12)


def test_spectrum_of_a_non_finite_covariance_is_one_nan_per_dimension():
    from seqvae.core.metrics import effective_rank, explained_variance, spectrum

    cov = torch.full((3, 3), float("nan"), dtype=torch.float32)
    lam = spectrum(cov)
    assert lam.shape == (3,) and lam.dtype == F64 and bool(torch.isnan(lam).all())
    assert torch.isnan(explained_variance(cov, 1)) and torch.isnan(effective_rank(cov))


def test_explained_variance_and_effective_rank_of_a_small_total_variance():
    """Total variance 0.4 < 1: the values are scale-free, not NaN."""
    from seqvae.core.metrics import effective_rank, explained_variance

    cov = torch.diag(torch.tensor([0.1, 0.3, 0.0], dtype=F64))
    assert float(explained_variance(cov, 1)) == pytest.approx(0.75, abs=1e-12)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert float(effective_rank(cov)) == pytest.approx(math.exp(h), abs=1e-12)
    zero = torch.zeros(2, 2, dtype=F64)
    assert torch.isnan(explained_variance(zero, 1)) and torch.isnan(effective_rank(zero))


def eval_batches():
    """Two constructed evaluation batches (3 and 2 texts, Z = 2, H = 3) as EvalMetrics.update kwargs."""
    g = torch.Generator().manual_seed(0)
    out = []
    for b, first in ((3, 0), (2, 3)):
        out.append(
            dict(
                rec=torch.rand(b, generator=g, dtype=F64) * 20 + 5,
                kl=torch.rand(b, generator=g, dtype=F64),
                n_tokens=torch.randint(3, 9, (b,), generator=g),
                mu=torch.randn(b, 2, generator=g, dtype=F64),
                logvar=torch.randn(b, 2, generator=g, dtype=F64) * 0.3,
                features=torch.randn(b, 3, generator=g, dtype=F64),
                iw_nll=torch.rand(b, generator=g, dtype=F64) * 20 + 4,
                iw_se=torch.rand(b, generator=g, dtype=F64),
                index=torch.arange(first, first + b),
            )
        )
    return out


def feed(metrics, batches, repeats=1):
    for _ in range(repeats):
        for i, kw in enumerate(batches):
            metrics.update(**kw, mi_generator=torch.Generator().manual_seed(10 + i))
    return metrics


def test_eval_metrics_defaults_mi_dataset_with_seed_zero():
    from seqvae.core.metrics import MI_DATASET_SAMPLES, EvalMetrics, mutual_information

    batches = eval_batches()
    out = feed(EvalMetrics(2, 3), batches).compute()
    mus = torch.cat([b["mu"] for b in batches])
    logvars = torch.cat([b["logvar"] for b in batches])
    expected = mutual_information(mus, logvars, torch.Generator().manual_seed(0), samples=MI_DATASET_SAMPLES)
    assert float(out["mi_dataset"]) == pytest.approx(float(expected), rel=1e-6)


def test_eval_metrics_reduce_every_state_across_ranks():
    """Two ranks holding the same states must give the metrics of one process that saw every
    batch twice: sums add, the stored posteriors and per-text rows concatenate (rank order)."""
    from seqvae.core.metrics import EvalMetrics

    def two_ranks(tensor, group=None):
        return [tensor.clone(), tensor.clone()]

    batches = eval_batches()
    ddp = feed(EvalMetrics(2, 3, per_text=True), batches)
    ddp.dist_sync_fn, ddp.distributed_available_fn = two_ranks, lambda: True
    single = feed(EvalMetrics(2, 3, per_text=True), batches, repeats=2)
    got, expected = ddp.compute(), single.compute()
    assert set(got) == set(expected)
    for k in expected:
        assert got[k].shape == expected[k].shape == (), k
        torch.testing.assert_close(got[k], expected[k], rtol=1e-6, atol=1e-6, equal_nan=True, msg=k)
    rows, expected_rows = ddp.per_text_rows(), single.per_text_rows()
    for k in expected_rows:
        torch.testing.assert_close(rows[k], expected_rows[k], rtol=0, atol=0, equal_nan=True, msg=k)
    assert rows["index"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert float(ddp.n) == 5 and float(ddp.tokens) == float(sum(b["n_tokens"].sum() for b in batches))  # unsynced again


def test_eval_metrics_sums_are_float64():
    """Posterior means and features far from 0 with small spread (a common collapsed-model
    picture): the float64 sums keep Var = (Σμ² - (Σμ)²/N)/(N-1), the covariance spectra and the
    mean cosine what a direct float64 computation on all rows gives."""
    from seqvae.core.losses import mean_pairwise_cosine
    from seqvae.core.metrics import EvalMetrics

    n = 1000
    i = torch.arange(n)
    a, b = (-1.0) ** i.double(), (-1.0) ** (i // 2).double()  # uncorrelated ±1 patterns
    mu = 3000.0 + torch.stack([0.2 * a, 0.05 * b], dim=1)  # variances ≈ 0.04 (active) and 0.0025 (not)
    features = 3000.0 + torch.stack([0.2 * a, 0.1 * b, torch.zeros(n, dtype=F64)], dim=1)
    m = EvalMetrics(2, 3, mi_dataset=False)
    for s in range(0, n, 100):  # in chunks, as evaluation feeds it
        m.update(
            torch.full((100,), 7.0, dtype=F64) + 1e-7 * s,
            torch.zeros(100, dtype=F64),
            torch.full((100,), 5),
            mu=mu[s : s + 100],
            logvar=torch.zeros(100, 2, dtype=F64),
            features=features[s : s + 100],
        )
    out = m.compute()
    assert int(out["au"]) == 1
    for name, x in (("mu", mu), ("feature", features)):
        lam = torch.linalg.eigvalsh(torch.cov(x.T)).flip(0).clamp_min(0)
        p = lam / lam.sum()
        assert float(out[f"{name}_ev1"]) == pytest.approx(float(p[0]), rel=1e-5), name
        assert float(out[f"{name}_erank"]) == pytest.approx(math.exp(-float(torch.special.xlogy(p, p).sum())), rel=1e-5), name
    assert float(out["mu_ev1"]) == pytest.approx(16 / 17, rel=1e-3) and float(out["feature_ev1"]) == pytest.approx(0.8, rel=1e-3)
    assert float(out["feature_cos"]) == pytest.approx(float(mean_pairwise_cosine(features)), abs=1e-7)
    assert float(out["rec"]) == pytest.approx(7.0 + 1e-7 * 450, rel=1e-7)


def test_eval_metrics_sync_makes_the_same_collectives_whatever_the_number_of_updates():
    """Under DDP every rank must issue the same all-gathers, in the same order, or the run hangs;
    ranks can see different numbers of batches. So a stored list state (posteriors, per-text
    rows) is gathered as one tensor, not one gather per update."""
    from seqvae.core.metrics import EvalMetrics

    shapes = {}
    for updates in (1, 2, 3):
        calls = []

        def gather(tensor, group=None, calls=calls):
            calls.append(tensor.dim())
            return [tensor]

        m = EvalMetrics(2, 3, per_text=True)
        m.dist_sync_fn, m.distributed_available_fn = gather, lambda: True
        for kw in (eval_batches() * 2)[:updates]:
            m.update(**kw, mi_generator=torch.Generator().manual_seed(0))
        m.compute()
        shapes[updates] = list(calls)
        calls.clear()
        m.per_text_rows()
        shapes[updates] += ["rows", *calls]
    assert shapes[1] == shapes[2] == shapes[3]


def test_eval_metrics_iw_keys_only_when_given_and_for_a_single_text():
    from seqvae.core.metrics import EvalMetrics

    one = dict(rec=torch.tensor([10.0]), kl=torch.tensor([1.0]), n_tokens=torch.tensor([4]))
    m = EvalMetrics(0, 1)
    m.update(**one)
    assert set(m.compute()) == {"loss", "rec", "kl", "elbo_ppl"}  # no IW given: no IW keys (not NaN ones)
    m = EvalMetrics(0, 1)
    m.update(**one, iw_nll=torch.tensor([9.0]), iw_se=torch.tensor([0.5]))
    out = m.compute()
    assert float(out["iw_nll"]) == 9.0 and float(out["iw_ppl"]) == pytest.approx(math.exp(9.0 / 4))
    assert float(out["iw_nll_se"]) == pytest.approx(0.5)
    m = EvalMetrics(0, 1, per_text=True)
    m.update(**one, index=torch.tensor([0]))
    rows = m.per_text_rows()  # no IW given: NaN placeholders, float64 like the given values
    assert rows["iw_nll"].dtype == rows["iw_se"].dtype == F64 and bool(torch.isnan(rows["iw_nll"]).all())


def test_eval_metrics_per_text_errors_and_empty_rows():
    from seqvae.core.metrics import EvalMetrics

    with pytest.raises(ValueError, match=r"^EvalMetrics\(per_text=True\)\.update needs index \(the texts' dataset positions\)$"):
        EvalMetrics(0, 1, per_text=True).update(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([3]))
    with pytest.raises(RuntimeError, match=r"^EvalMetrics was built with per_text=False: no per-text rows kept$"):
        EvalMetrics(0, 1).per_text_rows()
    rows = EvalMetrics(0, 1, per_text=True).per_text_rows()
    assert {k: (v.dtype, v.numel()) for k, v in rows.items()} == {
        "index": (torch.long, 0),
        "neg_elbo": (F64, 0),
        "kl": (F64, 0),
        "iw_nll": (F64, 0),
        "iw_se": (F64, 0),
        "tokens": (torch.long, 0),
    }
