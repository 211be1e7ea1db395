"""One reference run of `pin.py`, in the reference's own (patched) work copy as cwd:
`python -m tools.reference.child he|li SPEC.json`. Imports the reference's script as a module, installs
the observing hooks listed in pin.py's docstring, runs its `main(args)` (or, for the
evaluation, its own test/calc_mi/calc_au/calc_iwnll functions), and torch.saves what it saw."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

from tools.reference.pin_seqvae import FlatNoise, noise_streams

torch.set_num_threads(1)


class Stop(Exception):
    pass


class Observer:
    def __init__(self, spec: dict):
        self.spec = spec
        self.vae = None
        self.calls: list[dict] = []
        self.batches: dict[int, tuple[str, int]] = {}
        self.lists: dict[str, list] = {}
        self.outer = 0
        self.mi_checks: list[float] = []
        self.state = None
        self.stream: FlatNoise | None = None

    def current(self):
        return self.calls[-1] if self.calls and self.vae is not None and self.vae.training else None


def install(mod, obs: Observer) -> None:
    spec = obs.spec
    init = torch.load(spec["init"])

    class PinVAE(mod.VAE):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            own = self.state_dict()
            own.update(init)  # the reference's own init ran; seqvae's weights replace it, by name
            self.load_state_dict(own)
            obs.vae = self

        def loss(self, x, kl_weight, nsamples=1):
            out = super().loss(x, kl_weight, nsamples)
            c = obs.current()
            if c is not None and torch.is_grad_enabled():
                c.update(kl_weight=float(kl_weight), rec=float(out[1].mean()), kl=float(out[2].mean()))
            return out

    mod.VAE = PinVAE
    data_cls = mod.MonoTextData
    original_init, original_batch = data_cls.__init__, data_cls.create_data_batch

    def data_init(self, fname, *a, **k):
        original_init(self, fname, *a, **k)
        self._pin_split = {v: k for k, v in spec["files"].items()}.get(fname, fname)

    def create_data_batch(self, batch_size, device, batch_first=False):
        out = original_batch(self, batch_size, device, batch_first)
        if batch_size != 1:
            obs.lists.setdefault(self._pin_split, [b.tolist() for b in out])
            for i, b in enumerate(out):
                obs.batches[id(b)] = (self._pin_split, i)
        return out

    data_cls.__init__, data_cls.create_data_batch = data_init, create_data_batch
    dec_cls = mod.LSTMDecoder
    original_rec = dec_cls.reconstruct_error

    def reconstruct_error(self, x, z):
        c = obs.current()
        if c is not None and torch.is_grad_enabled() and "batch" not in c:
            split, i = obs.batches.get(id(x), ("?", -1))
            c["batch"] = i
        return original_rec(self, x, z)

    dec_cls.reconstruct_error = reconstruct_error
    original_backward = torch.Tensor.backward

    def backward(self, *a, **k):
        c = obs.current()
        if c is not None:
            c["loss"] = float(self.detach())
        return original_backward(self, *a, **k)

    torch.Tensor.backward = backward
    original_clip = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *a, **k):
        norm = original_clip(params, max_norm, *a, **k)
        c = obs.current()
        if c is not None:
            c["grad_norm"] = float(norm)
        return norm

    torch.nn.utils.clip_grad_norm_ = clip

    class PinSGD(torch.optim.SGD):
        def __init__(self, params, *a, **k):
            params = list(params)
            super().__init__(params, *a, **k)
            dec = {id(p) for p in obs.vae.decoder.parameters()}
            self.role = "dec" if id(params[0]) in dec else "enc"

        def zero_grad(self, *a, **k):
            super().zero_grad(*a, **k)
            if self.role == "dec" and obs.vae.training:
                if obs.outer >= spec["outer_steps"]:
                    obs.state = {k: v.clone() for k, v in obs.vae.state_dict().items()}
                    raise Stop
                torch.manual_seed(spec["noise_seed"] + len(obs.calls))
                obs.calls.append({"steps": []})

        def step(self, *a, **k):
            out = super().step(*a, **k)
            obs.calls[-1]["steps"].append(self.role)
            if self.role == "dec":
                obs.outer += 1
            return out

    mod.optim = argparse.Namespace(SGD=PinSGD, Adam=torch.optim.Adam)
    if hasattr(mod, "calc_mi"):
        original_mi = mod.calc_mi
        source = Path(mod.__file__).read_text().splitlines()
        # He et al.'s aggressive rule calls calc_mi on this line (`cur_mi = calc_mi(vae, val_data_batch)`); Li et al.'s script has none
        rule_line = next((i + 1 for i, ln in enumerate(source) if "cur_mi = calc_mi(" in ln), None)

        def calc_mi(model, data):
            value = original_mi(model, data)
            if rule_line is not None and sys._getframe(1).f_lineno == rule_line:
                obs.mi_checks.append(float(value))  # the aggressive rule's value (text.py: cur_mi)
            return value

        mod.calc_mi = calc_mi


def reference_args(mod_name: str, spec: dict) -> argparse.Namespace:
    net = spec["network"]
    files = spec["files"]
    args = dict(
        dataset="pin", momentum=0.0, nsamples=1, iw_nsamples=500, eval=False, load_path=spec.get("load_path", ""),
        decode_from="", decoding_strategy="greedy", decode_input="", warm_up=spec["warm_up"], kl_start=spec["kl_start"],
        aggressive=spec.get("aggressive", 0), seed=783435, jobid=0, taskid=0, cuda=False,
        save_path="model.pt", log_path="pin.log", label=False, enc_type="lstm", dec_type="lstm",
        batch_size=32, epochs=100, test_nepoch=5, train_data=files["train"], val_data=files["val"],
        test_data=files["test"], **net,
    )  # fmt: skip
    if mod_name == "text_anneal_fb":
        args.update(opt="sgd", reconstruct_from="", reconstruct_to="decoding.txt", exp_dir="exp_pin", save_ckpt=0,
                    save_latent=0, fix_var=-1, reset_dec=spec.get("reset_dec", False), load_best_epoch=15, lr=1.0,
                    fb=spec.get("fb", 0), target_kl=spec.get("target_kl", -1))  # fmt: skip
    return argparse.Namespace(**args)


def train(code: str, spec: dict) -> dict:
    mod_name = {"he": "text", "li": "text_anneal_fb"}[code]
    mod = importlib.import_module(mod_name)
    obs = Observer(spec)
    install(mod, obs)
    np.random.seed(783435)
    torch.manual_seed(783435)
    args = reference_args(mod_name, spec)
    try:
        mod.main(args)
    except Stop:
        pass
    if obs.state is None:
        raise SystemExit("reference_child: the reference's script ended before the case's last step")
    return {"calls": [c for c in obs.calls if c["steps"]], "state": obs.state, "mi_checks": obs.mi_checks,
            "batches": {k: obs.lists[k] for k in ("train", "val", "test")}}  # fmt: skip


def evaluate(code: str, spec: dict) -> dict:
    """The reference's own evaluation functions on the given weights, batches in list order, ε from
    the shared streams (a fresh MI stream for every MI call)."""
    mod = importlib.import_module({"he": "text", "li": "text_anneal_fb"}[code])
    utils = mod if code == "he" else importlib.import_module("utils")
    args = reference_args("text", spec)
    args.device = "cpu"
    train_data = mod.MonoTextData(args.train_data, label=False)
    test_data = mod.MonoTextData(args.test_data, label=False, vocab=train_data.vocab)
    init = lambda t: torch.nn.init.uniform_(t, -0.01, 0.01)  # noqa: E731 (replaced by the given weights)
    enc_cls = getattr(mod, "LSTMEncoder", None) or mod.GaussianLSTMEncoder
    if code == "li":
        args.fix_var = -1
    vae = mod.VAE(enc_cls(args, len(train_data.vocab), init, init), mod.LSTMDecoder(args, train_data.vocab, init, init), args)
    own = vae.state_dict()
    own.update(torch.load(spec["weights"]))
    vae.load_state_dict(own)
    vae.eval()
    batches = test_data.create_data_batch(batch_size=32, device="cpu", batch_first=True)
    singles = test_data.create_data_batch(batch_size=1, device="cpu", batch_first=True)
    n = sum(b.size(0) for b in batches)
    streams = noise_streams(spec["eval_seed"], n * 500 * args.nz)
    current = {"s": None}

    def reparameterize(self, mu, logvar, nsamples=1):
        b, nz = mu.size()
        eps = current["s"].take((b, nsamples, nz))
        return mu.unsqueeze(1) + eps * logvar.mul(0.5).exp().unsqueeze(1)

    type(vae.encoder).reparameterize = reparameterize
    np.random.permutation = lambda k: np.arange(k)
    out = {}
    with torch.no_grad():
        if code == "he":
            mi_fn = mod.calc_mi

            def fresh_mi(model, data):
                saved, current["s"] = current["s"], noise_streams(spec["eval_seed"], n * 500 * args.nz)["mi"]
                try:
                    return mi_fn(model, data)
                finally:
                    current["s"] = saved

            mod.calc_mi = fresh_mi
            current["s"] = streams["rec"]
            loss, nll, kl, ppl, mi = mod.test(vae, batches, "TEST", args)
            au, au_var = mod.calc_au(vae, batches)
            current["s"] = streams["iw"]
            iw_nll, iw_ppl = mod.calc_iwnll(vae, singles, args)
            out = {"loss": loss, "kl": kl, "elbo_ppl": float(ppl), "mi": float(mi), "au": int(au),
                   "au_var": au_var.tolist(), "iw_nll": float(iw_nll), "iw_ppl": float(iw_ppl)}  # fmt: skip
        else:
            current["s"] = streams["mi"]
            out = {"mi_dataset_1sample": float(utils.calc_mi(vae, batches))}
    out["batches"] = [b.tolist() for b in batches]
    return out


def main() -> None:
    code, spec_file = sys.argv[1], sys.argv[2]
    spec = json.loads(Path(spec_file).read_text())
    sys.path.insert(0, str(Path.cwd()))
    result = evaluate(code, spec) if spec["case"].startswith("eval") else train(code, spec)
    torch.save(result, spec["out"])


if __name__ == "__main__":
    main()
