"""One SA-VAE reference run of `pin_savae.py`, in a clean copy of jxhe/vae-lagging-encoder's `sa-vae`
branch as cwd: `python savae_child.py SPEC.json`. Builds He et al.'s LSTMEncoder, LSTMDecoder,
VAE and OptimN2N (their code, unchanged) with seqvae's weights, and drives them as text_sa.py's
training loop and `--eval` path do, on seqvae's batch and noise; torch.saves what it saw.

What is substituted, nothing in the reference's files being edited:
- `psutil` (imported by optim_n2n.py for a memory report it never calls here) is a stub;
- optim_n2n.py's `torch.cuda.FloatTensor(size).normal_(0, 1)` (its ε_k, CUDA-only) returns the
  next of seqvae's ε_k (training) or draws from the pin's `svi` generator (evaluation);
- `reparameterize` without a given z reads seqvae's final ε (training) or the pin's `iw` generator;
- text_sa.py's `variational_loss` is a closure inside its `main`: restated here as the same three
  calls (reparameterize with z, calc_kl, reconstruct_error; (rec + w·kl).mean());
- every `clip_grad_norm` call of OptimN2N and the final `clip_grad_norm_` record their norms.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import torch

torch.set_num_threads(1)


class _Cuda:
    """Stands in for `torch.cuda` inside optim_n2n.py: FloatTensor(size).normal_() gives the pin's ε."""

    def __init__(self, source):
        self.source = source

    def FloatTensor(self, size):  # noqa: N802 (the name the reference calls)
        source = self.source

        class _Draw:
            def normal_(self, mean=0, std=1):
                return source(tuple(size))

        return _Draw()


class _TorchProxy(types.ModuleType):
    def __init__(self, cuda):
        super().__init__("torch")
        self._cuda = cuda

    def __getattr__(self, name):
        return self._cuda if name == "cuda" else getattr(torch, name)


def build(spec: dict):
    sys.modules.setdefault("psutil", types.ModuleType("psutil"))
    sys.path.insert(0, str(Path.cwd()))
    import modules
    from modules import optim_n2n

    net = spec["network"]
    args = argparse.Namespace(ni=net["ni"], enc_nh=net["enc_nh"], dec_nh=net["dec_nh"], nz=net["nz"],
                              dec_dropout_in=0.0, dec_dropout_out=0.0, ngpu=1, gpu_ids=[0], cuda=False,
                              device=torch.device("cpu"))  # fmt: skip
    vocab = list(range(spec["vocab_size"]))  # the decoder reads len(vocab) only
    init = lambda t: torch.nn.init.uniform_(t, -0.01, 0.01)  # noqa: E731 (replaced by seqvae's weights)
    vae = modules.VAE(modules.LSTMEncoder(args, len(vocab), init, init), modules.LSTMDecoder(args, vocab, init, init), args)
    own = vae.state_dict()
    own.update(torch.load(spec["weights"]))
    vae.load_state_dict(own)
    dtype = getattr(torch, spec["dtype"])
    vae.to(dtype)
    return vae, optim_n2n, dtype


def record_clips(optim_n2n, log: list) -> None:
    original = optim_n2n.OptimN2N.clip_grad_norm

    def clip(self, parameters, max_norm, norm_type=2):
        norm = float(sum(float(p.norm()) ** 2 for p in parameters) ** 0.5)
        log.append(norm)
        return original(self, parameters, max_norm, norm_type)

    optim_n2n.OptimN2N.clip_grad_norm = clip


def train(spec: dict) -> dict:
    vae, optim_n2n, dtype = build(spec)
    noise = torch.load(spec["noise"])  # seqvae's draws: ε_0..ε_{K-1} (B, Z), then the final ε (B, 1, Z)
    steps = iter(noise["steps"])
    optim_n2n.torch = _TorchProxy(_Cuda(lambda size: next(steps)))
    encoder_cls = type(vae.encoder)
    with_z = encoder_cls.reparameterize

    def reparameterize(self, mu, logvar, nsamples=1, z=None):
        return with_z(self, mu, logvar, nsamples, noise["final"][:, 0] if z is None else z)

    encoder_cls.reparameterize = reparameterize
    clips: list[float] = []
    record_clips(optim_n2n, clips)
    w = spec["kl_weight"]

    def variational_loss(input, x, vae, z=None):
        mean, logvar = input
        z_samples = vae.encoder.reparameterize(mean, logvar, 1, z)
        kl = vae.encoder.calc_kl(mean, logvar)
        return (vae.decoder.reconstruct_error(x, z_samples).squeeze(1) + w * kl).mean(-1)

    meta = optim_n2n.OptimN2N(variational_loss, vae, list(vae.decoder.parameters()), eps=1e-5, lr=[1, 1],
                              iters=spec["steps"], momentum=0.5, acc_param_grads=1, max_grad_norm=spec["clip"])  # fmt: skip
    x = torch.tensor(spec["tokens"], dtype=torch.long)
    vae.train()
    losses = []
    meta.loss_fn = lambda *a: losses.append(variational_loss(*a)) or losses[-1]
    # text_sa.py's training step, statement for statement
    vae.zero_grad()
    mean, logvar = vae.encoder.forward(x)
    var_params = torch.cat([mean, logvar], 1)
    mean_svi = mean.detach().clone().requires_grad_()
    logvar_svi = logvar.detach().clone().requires_grad_()
    mean_final, logvar_final = meta.forward([mean_svi, logvar_svi], x)
    n_forward = len(losses)
    z = vae.encoder.reparameterize(mean_final, logvar_final, 1)
    rec = vae.decoder.reconstruct_error(x, z).mean(dim=1)
    kl = vae.encoder.calc_kl(mean_final, logvar_final)
    loss = (rec + w * kl).mean(-1)
    loss.backward(retain_graph=True)
    clips_forward = list(clips)
    meta_grads = meta.backward([mean_final.grad, logvar_final.grad])
    var_params.backward(torch.cat(meta_grads, 1))
    grads = {k: p.grad.detach().clone() for k, p in vae.named_parameters()}
    total = float(torch.nn.utils.clip_grad_norm_(vae.parameters(), 5.0))
    params = [(meta.input_cache[0][k].clone(), meta.input_cache[1][k].clone()) for k in range(spec["steps"])]
    params.append((mean_final.detach().clone(), logvar_final.detach().clone()))
    return {"params": params, "inner_losses": [float(v) for v in losses[:n_forward]], "loss": float(loss),
            "rec": float(rec.mean()), "kl": float(kl.mean()), "grads": grads, "grad_norm": total,
            "clip_norms_forward": clips_forward, "clip_norms_backward": clips[len(clips_forward):]}  # fmt: skip


def evaluate(spec: dict) -> dict:
    vae, optim_n2n, dtype = build(spec)
    svi = torch.Generator().manual_seed(spec["svi_seed"])
    iw = torch.Generator().manual_seed(spec["iw_seed"])
    optim_n2n.torch = _TorchProxy(_Cuda(lambda size: torch.randn(size, generator=svi, dtype=dtype)))

    def reparameterize(self, mu, logvar, nsamples=1, z=None):
        b, nz = mu.size()
        eps = z.unsqueeze(1) if z is not None else torch.randn((b, nsamples, nz), generator=iw, dtype=dtype)
        return mu.unsqueeze(1) + eps * logvar.mul(0.5).exp().unsqueeze(1)

    type(vae.encoder).reparameterize = reparameterize

    def variational_loss(input, x, vae, z=None):  # text_sa.py --eval: kl_weight = 1.0
        mean, logvar = input
        z_samples = vae.encoder.reparameterize(mean, logvar, 1, z)
        return (vae.decoder.reconstruct_error(x, z_samples).squeeze(1) + vae.encoder.calc_kl(mean, logvar)).mean(-1)

    meta = optim_n2n.OptimN2N(variational_loss, vae, list(vae.decoder.parameters()), eps=1e-5, lr=[1, 1],
                              iters=spec["steps"], momentum=0.5, acc_param_grads=1, max_grad_norm=spec["clip"])  # fmt: skip
    vae.eval()  # the reference turns the decoder's dropouts off; the pin has none
    out = []
    for tokens in spec["batches"]:
        x = torch.tensor(tokens, dtype=torch.long)
        # one chunk of all the samples: one refinement per batch (seqvae's variant; calc_iwnll's ns = 2 re-refines)
        nll = vae.nll_iw(x, meta, nsamples=spec["iw_samples"], ns=spec["iw_samples"])
        out.append(nll.detach().clone())
    # the refined posteriors alone, with a fresh svi stream (the reference's sa_forward, as test() and calc_au use it)
    svi.manual_seed(spec["svi_seed"])
    refined = [tuple(t.detach().clone() for t in vae.encoder.sa_forward(torch.tensor(b), meta)) for b in spec["batches"]]
    return {"iw_nll": out, "refined": refined}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = evaluate(spec) if spec["case"] == "eval" else train(spec)
    torch.save(result, spec["out"])


if __name__ == "__main__":
    main()
