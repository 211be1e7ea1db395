"""seqvae's side of the reference pins (issue 36): the same small model, weights, batches and noise
as `tools/reference/pin.py` gives He et al.'s and Li et al.'s code, run through seqvae's own
training step (Lightning, manual optimisation, the aggressive inner loop) and evaluation path
(`evaluate_batch` + `EvalMetrics`). Used by the harness (to print reference | seqvae) and by
`tests/test_reference_pins.py` (to hold seqvae to the numbers in `tests/fixtures/reference/`).

What is injected, on both sides alike, so that the two codes see the same randomness:
- training: every training loss call starts from `torch.manual_seed(noise_seed + i)` (i counts the
  calls, inner aggressive steps included). Both codes then draw ε of shape (B, 1, Z) and the two
  dropout masks in the same order from the global generator (checked: identical draws);
- evaluation: ε comes from a flat buffer per purpose (`FlatNoise`: the z of −ELBO, the importance
  samples, the per-batch MI's z), read in request order; both codes request per text in the same
  order, so text j's k-th importance sample is the same vector on both sides.
"""

from __future__ import annotations

import contextlib
import zlib

import pytorch_lightning as pl
import torch

# The small configuration of the pins (issue 36: "e.g. emb 32, LSTM 64, z 8").
NETWORK = {"embed_dim": 32, "hidden_dim": 64, "latent_dim": 8, "dropout_in": 0.5, "dropout_out": 0.5}
REFERENCE_NETWORK = {"ni": 32, "enc_nh": 64, "dec_nh": 64, "nz": 8, "dec_dropout_in": 0.5, "dec_dropout_out": 0.5}

# seqvae parameter name -> the references' (He et al.'s LSTMEncoder/LSTMDecoder, Li et al.'s
# GaussianLSTMEncoder/LSTMDecoder: the same names).
TO_REFERENCE = {
    "encoder.embed.weight": "encoder.embed.weight",
    "encoder.to_posterior.weight": "encoder.linear.weight",
    "decoder.embed.weight": "decoder.embed.weight",
    "decoder.z_to_c0.weight": "decoder.trans_linear.weight",
    "decoder.out.weight": "decoder.pred_linear.weight",
}
for _side in ("encoder", "decoder"):
    for _p in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
        TO_REFERENCE[f"{_side}.lstm.{_p}"] = f"{_side}.lstm.{_p}"


# The order of the references' parameters (module declaration order), in seqvae's names: the order in
# which clip_grad_norm_ sums the squared norms. Another order rounds the joint norm differently in the
# last bit; once clipping binds, that bit is amplified (`train(..., reference_norm_order=True)`).
REFERENCE_ORDER = (
    ["encoder.embed.weight"] + [f"encoder.lstm.{p}" for p in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")]
    + ["encoder.to_posterior.weight", "decoder.embed.weight", "decoder.z_to_c0.weight"]
    + [f"decoder.lstm.{p}" for p in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")] + ["decoder.out.weight"]
)  # fmt: skip


def build(vocab_size: int, seed: int, **options):
    """seqvae's model of the pins, initialised from `seed` with He et al.'s scheme (`init: reference`)."""
    from seqvae import SeqVAE

    torch.manual_seed(seed)
    settings = dict(NETWORK, pooling="last", init="reference", lr=1.0, grad_clip=5.0, mi_dataset=False)
    settings.update(val_iw_samples=0, test_iw_samples=0, iw_max_elements=2**40)
    settings.update(options)
    return SeqVAE(vocab_size=vocab_size, **settings)


def eval_model(vocab_size: int, seed: int):
    """The weights both codes evaluate: PyTorch's init (features ~10x He et al.'s) with the posterior
    means' rows x 60, so that the means vary across texts (4 of 8 dimensions active, the variances
    8% or more from the 0.01 threshold), KL is far from 0 and IW-NLL far from -ELBO. Untrained:
    the evaluation pins do not lean on the training pins."""
    model = build(vocab_size, seed, init="pytorch")
    with torch.no_grad():
        model.encoder.to_posterior.weight[: NETWORK["latent_dim"]].mul_(60.0)
    return model


def to_reference(state: dict) -> dict:
    return {TO_REFERENCE[k]: v.detach().clone() for k, v in state.items() if k in TO_REFERENCE}


def from_reference(state: dict) -> dict:
    back = {v: k for k, v in TO_REFERENCE.items()}
    return {back[k]: v.detach().clone() for k, v in state.items() if k in back}


# ---------------------------------------------------------------- parameter digests
def digest(state: dict, samples: int = 64) -> dict:
    """Per tensor: sum, sum of squares, a projection on a fixed random direction (any change of any
    element moves it) and `samples` elements at fixed random positions; float64 throughout."""
    out = {}
    for name, t in sorted(state.items()):
        x = t.detach().double().flatten()
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        direction = torch.randn(x.numel(), generator=g, dtype=torch.float64)
        where = torch.randint(0, x.numel(), (samples,), generator=g)
        out[name] = {
            "numel": x.numel(),
            "sum": float(x.sum()),
            "sumsq": float((x * x).sum()),
            "proj": float((x * direction).sum()),
            "index": where.tolist(),
            "values": x[where].tolist(),
        }
    return out


# ---------------------------------------------------------------- training replay
def batch_dict(tokens) -> dict:
    t = torch.as_tensor(tokens, dtype=torch.long)
    return {"tokens": t, "lengths": torch.full((t.size(0),), t.size(1), dtype=torch.long), "index": torch.arange(t.size(0))}


class _Epochs(torch.utils.data.IterableDataset):
    def __init__(self, replay):
        self.replay = replay

    def __iter__(self):
        epoch = self.replay.epochs[min(self.replay.epoch, len(self.replay.epochs) - 1)]
        self.replay.epoch += 1
        for i in epoch:
            yield self.replay.batches[i]

    def __len__(self):
        return len(self.replay.epochs[0])


class ReplayData(pl.LightningDataModule):
    """The reference's training batches in the reference's order: `epochs` lists batch indices per
    epoch; `inner` the indices its aggressive inner loop drew (served by `random_train_batch`)."""

    def __init__(self, batches: list, epochs: list[list[int]], inner: list[int], val: list):
        super().__init__()
        self.batches = [batch_dict(b) for b in batches]
        self.epochs, self.inner, self.epoch = epochs, list(inner), 0
        self.val = [batch_dict(b) for b in val]
        self.vocab = None
        self.drawn: list[int] = []

    def train_dataloader(self):
        return torch.utils.data.DataLoader(_Epochs(self), batch_size=None)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.val, batch_size=None)

    def random_train_batch(self, rng) -> dict:
        i = self.inner.pop(0)
        self.drawn.append(i)
        return self.batches[i]


class _StopAfter(pl.Callback):
    def __init__(self, updates: int):
        self.updates = updates

    def on_train_batch_end(self, trainer, module, *args):
        if module.num_updates >= self.updates:
            trainer.should_stop = True


@contextlib.contextmanager
def _recording_clip(norms: list, order: dict | None = None):
    original = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *a, **k):
        if order is not None:
            params = sorted(params, key=lambda p: order[id(p)])
        norm = original(params, max_norm, *a, **k)
        norms.append(float(norm))
        return norm

    torch.nn.utils.clip_grad_norm_ = clip
    try:
        yield
    finally:
        torch.nn.utils.clip_grad_norm_ = original


def train(case: dict, model=None):
    """Runs seqvae's training on the case's batches (its `fit` loop: `training_step`, `update_step`,
    `AggressiveTraining`) with the case's per-call seeds; returns (model, record)."""
    model = model or build(case["vocab_size"], case["init_seed"], **case_options(case))
    data = ReplayData(case["batches"], case["epochs"], case.get("inner", []), case["val"])
    by_id = {id(b["tokens"]): i for i, b in enumerate(data.batches)}
    calls, norms = [], []
    original = model.loss_terms

    def seeded(batch, kl_weight):
        torch.manual_seed(case["noise_seed"] + len(calls))
        terms = original(batch, kl_weight)
        calls.append({"batch": by_id.get(id(batch["tokens"])), "kl_weight": float(kl_weight),
                      "loss": float(terms["loss"].detach()), "rec": float(terms["rec"]), "kl": float(terms.get("kl", 0.0))})
        return terms

    model.loss_terms = seeded
    rows = case.get("frozen_decoder_rows", [])
    if rows:
        # He et al.'s (and Li et al.'s) decoder embedding is built with padding_idx=-1, meant as "no
        # padding"; PyTorch reads it as row V-1, whose gradient is then always zero: the last word of the
        # vocabulary keeps its initial decoder embedding. Reproduced here (and only here) so that
        # everything else can be compared exactly; `pin.py` reports the row apart.
        frozen = torch.tensor(rows)
        hook = model.decoder.embed.weight.register_hook(lambda g: g.index_fill(0, frozen, 0.0))
    inner_steps, decisions = [], []
    if model.aggressive is not None:
        mi_values = list(case["mi_checks"])
        train_encoder, end_epoch = model.aggressive.train_encoder, model.aggressive.end_epoch

        def counted(module, batch, w):
            n = train_encoder(module, batch, w)
            inner_steps.append(n)
            return n

        def replayed_mi(mi):  # the rule fed the reference's MI values (the MI estimate is pinned in `evaluate`)
            ended = end_epoch(mi_values.pop(0)) if mi_values else False
            decisions.append(bool(ended))
            return ended

        model.aggressive.train_encoder, model.aggressive.end_epoch = counted, replayed_mi
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=len(case["epochs"]), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[_StopAfter(case["outer_steps"])],
    )  # fmt: skip
    order = None
    if case.get("reference_norm_order"):
        named = dict(model.named_parameters())
        order = {id(named[n]): i for i, n in enumerate(REFERENCE_ORDER)}
    with _recording_clip(norms, order):
        trainer.fit(model, datamodule=data)
    for c, n in zip(calls, norms):
        c["grad_norm"] = n
    model.loss_terms = original
    if rows:
        hook.remove()
    record = {"calls": calls, "inner_steps": inner_steps, "inner_batches": data.drawn, "mi_decisions": decisions}
    return model, record


def case_options(case: dict) -> dict:
    """The SeqVAE options a case names (schedules and strategies as objects)."""
    from seqvae import AggressiveTraining, FreeBits, LinearKLWarmup

    opts = {"kl_schedule": LinearKLWarmup(start=case["kl_start"], warmup_epochs=case["warmup_epochs"])}
    if case.get("aggressive"):
        opts["aggressive"] = AggressiveTraining(max_inner_steps=99, window=15, seed=0, clip=case.get("clip", "joint"))
    if case.get("free_bits") is not None:
        opts["kl_penalty"] = FreeBits(target=case["free_bits"])
    opts.update(case.get("seqvae_options", {}))
    return opts


# ---------------------------------------------------------------- evaluation with shared noise
class FlatNoise:
    """Standard-normal values of one purpose, read in request order: `take(shape)` returns the next
    prod(shape) values. The same seed gives the same stream to both codes whatever their call shapes."""

    def __init__(self, seed: int, size: int):
        self.values = torch.randn(size, generator=torch.Generator().manual_seed(seed))
        self.cursor = 0

    def take(self, shape, dtype=torch.float32) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= int(s)
        if self.cursor + n > self.values.numel():
            raise RuntimeError(f"FlatNoise: {self.cursor + n} values asked, {self.values.numel()} held")
        out = self.values[self.cursor : self.cursor + n].view(*shape).to(dtype)
        self.cursor += n
        return out


NOISE_STREAMS = ("rec", "iw", "mi")


def noise_streams(seed: int, size: int) -> dict:
    return {s: FlatNoise(seed * 10 + i, size) for i, s in enumerate(NOISE_STREAMS)}


@contextlib.contextmanager
def _shared_noise(pick):
    """seqvae's `sample_posterior` (the diagonal Gaussian's draws, wherever evaluation and the MI
    estimator ask its posterior for z) answered from the `FlatNoise` stream `pick(generator)`
    returns, for the duration of the block."""
    import seqvae.core.gaussian as gaussian

    def shared(mu, logvar, k, generator=None):
        eps = pick(generator).take((mu.size(0), k, mu.size(1)), mu.dtype)
        return mu.unsqueeze(1) + (0.5 * logvar).exp().unsqueeze(1) * eps

    original = gaussian.sample_posterior
    gaussian.sample_posterior = shared
    try:
        yield
    finally:
        gaussian.sample_posterior = original


def _stream_size(model, batches: list) -> int:
    """Values per stream: enough for K = 500 importance samples of every text (the references' K)."""
    return sum(len(b) for b in batches) * 500 * model.hparams.latent_dim


def evaluate(model, batches: list, iw_samples: int, seed: int) -> dict:
    """seqvae's evaluation path (`evaluate_batch` into `EvalMetrics`) on the reference's test
    batches in their order, its three noise generators answered from the shared `FlatNoise`
    streams; returns the metrics and the per-dimension variance of the posterior means."""
    from seqvae.core import metrics
    from seqvae.core.evaluation import EvalNoise, evaluate_batch

    model.eval()
    streams = noise_streams(seed, _stream_size(model, batches))
    model._noise = EvalNoise(0, torch.device("cpu"), model.hparams.latent_dim)
    which = {id(getattr(model._noise, s)): streams[s] for s in NOISE_STREAMS}
    m = metrics.EvalMetrics(model.hparams.latent_dim, model.encoder.feature_dim, False, seed=0)
    with _shared_noise(lambda generator: which[id(generator)]), torch.no_grad():
        for b in batches:
            evaluate_batch(model, batch_dict(b), m, iw_samples)
    out = {k: float(v) for k, v in m.compute().items()}
    out["au_var"] = metrics.mean_variance(m.mu_sum, m.mu_sq_sum, int(m.n)).tolist()
    return out


def mi_dataset(model, batches: list, seed: int) -> float:
    """seqvae's MI estimator (`mutual_information`) with the whole set as the pool and one z per
    posterior, as Li et al.'s calc_mi; ε from the shared MI stream."""
    from seqvae.core import metrics

    model.eval()
    with torch.no_grad():
        posts = [model.encoder(batch_dict(b)["tokens"], batch_dict(b)["lengths"])[:2] for b in batches]
    mu = torch.cat([p[0] for p in posts]).double()
    logvar = torch.cat([p[1] for p in posts]).double()
    stream = noise_streams(seed, _stream_size(model, batches))["mi"]
    with _shared_noise(lambda generator: stream):
        return float(metrics.mutual_information(mu, logvar, None, samples=1))
