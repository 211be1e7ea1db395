"""Host reads of tensor values in a training step (issue 46): on a GPU each one waits for all the
work queued before it. The CPU has no such wait, so the count is taken here on the CPU, through the
code a CUDA device runs (`chunking_for` answers with the CUDA plan), and held."""

from __future__ import annotations

import pytest
import torch
from test_fused_ce import TOL, padded_batch, tiny
from test_model import corpus  # noqa: F401  (a fixture)

from seqvae.core import chunking, fused_ce

READS = ("item", "__bool__", "__float__", "__int__", "tolist", "nonzero", "numpy")


class HostReads:
    """Counts Tensor.item/__bool__/__float__/__int__/tolist/nonzero/numpy calls and boolean-mask
    indexing (an implicit nonzero: its result's size is read back)."""

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in READS:
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(name, real))
        real_getitem = torch.Tensor.__getitem__

        def getitem(t, index):
            parts = index if isinstance(index, tuple) else (index,)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in parts):
                self.calls.append("boolean mask")
            return real_getitem(t, index)

        monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)

    def _counted(self, name, real):
        def counted(t, *a, **k):
            self.calls.append(name)
            return real(t, *a, **k)

        return counted


@pytest.fixture
def cuda_plan(monkeypatch):
    monkeypatch.setattr(chunking, "chunking_for", lambda device_type: chunking.CUDA)


def bucket_batch():
    """Equal lengths, no padding: what the bucket sampler (the default) gives."""
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(4, 23, (6, 9), generator=g)
    tokens[:, 0], tokens[:, -1] = 1, 2
    return {"tokens": tokens, "lengths": torch.full((6,), 9)}


@pytest.mark.parametrize("kw", [{}, {"skip": True}, {"latent_dim": 0}])
def test_the_loss_its_backward_and_the_clip_read_nothing_back_on_the_gpu_path(kw, cuda_plan, monkeypatch):
    model = tiny(True, **kw).train()
    reads = HostReads(monkeypatch)
    loss = model.loss_terms(bucket_batch(), kl_weight=0.5)["loss"]
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(model.parameters()), 5.0)
    assert reads.calls == []


@pytest.mark.parametrize("kw", [{}, {"skip": True}, {"latent_dim": 0}, {"word_dropout": 0.3}])
def test_the_gpu_path_gives_the_cpu_paths_loss_and_gradients_on_a_padded_batch(kw, monkeypatch):
    """Padding weighted 0 instead of selected away: the same loss and gradients."""
    out = {}
    for plan in (chunking.CPU, chunking.CUDA):
        monkeypatch.setattr(chunking, "chunking_for", lambda device_type, plan=plan: plan)
        model = tiny(True, **kw).train()
        torch.manual_seed(1)  # the same dropout masks and z
        loss = model.loss_terms(padded_batch(), kl_weight=0.5)["loss"]
        loss.backward()
        out[plan] = loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    cpu, cuda = out[chunking.CPU], out[chunking.CUDA]
    torch.testing.assert_close(cuda[0], cpu[0], **TOL)
    assert cuda[1].keys() == cpu[1].keys()
    for name, g in cuda[1].items():
        torch.testing.assert_close(g, cpu[1][name], rtol=1e-5, atol=1e-6, msg=name)


def test_the_gpu_path_evaluates_as_the_cpu_path(monkeypatch):
    batch, z = padded_batch(), torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(4))
    got = {}
    for plan in (chunking.CPU, chunking.CUDA):
        monkeypatch.setattr(chunking, "chunking_for", lambda device_type, plan=plan: plan)
        with torch.inference_mode():
            got[plan] = tiny(True, skip=True).eval().decoder.log_likelihood(batch["tokens"], batch["lengths"], z)
    torch.testing.assert_close(got[chunking.CUDA], got[chunking.CPU], **TOL)


def test_a_weighted_loss_still_gets_its_exact_gradient_without_the_promise():
    """Without `uniform_grad` the backward tests its incoming gradient, as before."""
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(10, 6, generator=g, requires_grad=True), torch.randn(7, 6, generator=g, requires_grad=True)
    targets, weights = torch.randint(0, 7, (10,), generator=g), torch.rand(10, generator=g)
    (fused_ce.linear_cross_entropy(h, w, targets) * weights).sum().backward()
    plain_h, plain_w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (torch.nn.functional.cross_entropy(plain_h @ plain_w.T, targets, reduction="none") * weights).sum().backward()
    torch.testing.assert_close(h.grad, plain_h.grad, **TOL)
    torch.testing.assert_close(w.grad, plain_w.grad, **TOL)


def test_the_chunking_per_device(monkeypatch):
    """The CPU's sizes are fused_ce's own (unchanged); a CUDA device gets a batch per chunk,
    thousands of evaluation rows, and a quarter of its free memory as the IW budget."""
    assert chunking.chunking_for("cpu") == chunking.CPU and chunking.CPU.rows(20_000, True) is None
    cuda = chunking.chunking_for("cuda")
    assert cuda.rows(20_000, True) == 2**28 // 20_000 == 13_421  # > 32 x 80 rows: one chunk
    assert cuda.rows(20_000, False) == 13_421 and cuda.rows(100_000, False) == 8192
    assert chunking.iw_budget("cpu", None) == chunking.iw_budget("cpu", 80 * 2**30) == 2**26
    assert chunking.iw_budget("cuda", 80 * 2**30) == 20 * 2**30
    from seqvae.core.evaluation import iw_chunk

    assert iw_chunk(torch.zeros(32, 81, dtype=torch.long), 20_000, None) == 1  # today's CPU figure
    assert 20 * 2**30 // (32 * 81 * 20_000) == 414  # samples per decoder call on an 80 GiB-free card


# ---------------------------------------------------------------- the whole training step, through Lightning
def fit_counting_reads(tmp_path, monkeypatch, model, dm, **kw):
    """Fits one epoch; host reads per training batch (from its start to its end)."""
    import pytorch_lightning as pl
    from test_model import trainer

    reads = HostReads(monkeypatch)
    per_batch, start = [], [0]

    class Count(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            start[0] = len(reads.calls)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            per_batch.append(reads.calls[start[0] :])

    trainer(tmp_path, limit_val_batches=0, callbacks=[Count()], **kw).fit(model, dm)
    return per_batch


def test_a_default_training_step_reads_back_only_at_the_logging_interval(corpus, tmp_path, monkeypatch, cuda_plan):  # noqa: F811
    from test_model import datamodule, tiny_model

    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size)
    per_batch = fit_counting_reads(tmp_path, monkeypatch, model, dm, limit_train_batches=7, log_every_n_steps=3)
    assert len(per_batch) == 7
    logging = {2, 5, 6}  # every 3rd step, and the epoch's last
    assert [i for i, calls in enumerate(per_batch) if calls] == sorted(logging)
    assert all(len(per_batch[i]) <= 1 for i in logging), per_batch  # the finite check's one read (Lightning's own at the write)
    assert isinstance(model.train_loss_mean.total, torch.Tensor) and model.train_loss_mean.total.dtype == torch.float64


def test_a_non_finite_update_is_not_applied_and_stops_the_run_at_the_next_read(corpus, tmp_path, monkeypatch, cuda_plan):  # noqa: F811
    import pytorch_lightning as pl
    from test_model import NaNAfter, datamodule, tiny_model
    from test_model import trainer as make_trainer

    from seqvae.core.model import NonFiniteError

    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size, regularizers=[NaNAfter(3)])
    snapshots = []

    class Snapshot(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            snapshots.append({k: v.clone() for k, v in module.state_dict().items()})

    with pytest.raises(NonFiniteError, match=r"non-finite nan_after, loss, grad_norm at update 3 \(epoch 0, read at update 5\)"):
        make_trainer(tmp_path, limit_train_batches=5, limit_val_batches=0, callbacks=[Snapshot()]).fit(model, dm)
    for k, v in model.state_dict().items():
        assert torch.equal(v, snapshots[2][k]), k  # updates 3-5 were all non-finite: none changed a weight
