#!/usr/bin/env python
"""SA-VAE pinned to He et al.'s code (issue 49): `python -m tools.reference pin-sa --he DIR`
(DIR: a clean work tree of jxhe/vae-lagging-encoder at its `sa-vae` branch). A developer tool, not CI.

Runs He et al.'s OptimN2N, LSTMEncoder, LSTMDecoder and VAE (`savae_child.py`, in a copy of the
clone outside the repository) on seqvae's weights, one batch of the pins' batches
(tests/fixtures/reference/batches.json) and seqvae's noise, and seqvae's `SVIRefinement` on the same;
writes tests/fixtures/reference/sa_vae.json (the inputs' seeds and the reference's numbers only) and
prints quantity | reference | seqvae | max abs | max rel (the table docs/sa_vae.md quotes).

Cases (the pins' network: emb 32, LSTM 64, z 8, V 903; dropout 0, so that no mask needs sharing):
- `exact` (float64, a batch of 32 texts of 13 tokens, w 0.5, K 10): the refined (mu, log σ²) after
  every step, the inner losses, the final loss, and every gradient. In float64 the reference's
  finite differences (r = 1e-5) are accurate to ~1e-5 relative, and on these weights no norm in its
  backward reaches 5, so its clipping never binds: seqvae's exact double-backward gradient must agree.
- `clipped` (float32, the same batch, the decoder's output layer x 4 so that the joint norm in the
  reference's backward passes 5, as it does at the paper's size): the forward path still agrees; the
  gradients differ by the clipping mix of SPEC §13.6, measured here (cosine and relative difference).
- `eval` (float64, test batches): the refined posteriors at w = 1 and IW-NLL with refinement, the
  reference's `nll_iw` called with ns = nsamples (one refinement per batch: seqvae's variant).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from tools.reference import pin_seqvae

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

FIXTURE = REPO / "tests/fixtures/reference/sa_vae/pin.json"  # its own folder: test_reference_pins reads every *.json in reference/ as a he+li pin
BATCHES = REPO / "tests/fixtures/reference/batches.json"
MODEL_SEED, NOISE_SEED, SVI_SEED, IW_SEED = 17, 2000, 31, 37
CASES = {
    "exact": {"dtype": "float64", "train_batch": 5, "kl_weight": 0.5, "steps": 10, "clip": 5.0, "out_scale": 1.0},
    "clipped": {"dtype": "float32", "train_batch": 5, "kl_weight": 0.5, "steps": 10, "clip": 5.0, "out_scale": 4.0},
    "eval": {"dtype": "float64", "test_batches": [3, 4, 5, 6, 7], "steps": 10, "clip": 5.0, "iw_samples": 50, "out_scale": 1.0},
}


# ---------------------------------------------------------------- seqvae's side
def model(vocab_size: int, case: dict):
    """The pins' network with PyTorch's init (features ~10x He et al.'s), dropout 0, the posterior means'
    rows x 60 (means that vary, KL far from 0: the steps have work to do), the output layer x `out_scale`."""
    from seqvae import SVIRefinement

    refine = SVIRefinement(steps=case["steps"], lr=1.0, momentum=0.5, clip=case["clip"])
    m = pin_seqvae.build(vocab_size, MODEL_SEED, init="pytorch", dropout_in=0.0, dropout_out=0.0, refine=refine,
                         fused_output=case["dtype"] != "float64")  # fmt: skip
    with torch.no_grad():
        m.encoder.to_posterior.weight[: pin_seqvae.NETWORK["latent_dim"]].mul_(60.0)
        m.decoder.out.weight.mul_(case["out_scale"])
    return m.to(getattr(torch, case["dtype"]))


def batch(tokens) -> dict:
    t = torch.as_tensor(tokens, dtype=torch.long)
    return {"tokens": t, "lengths": torch.full((t.size(0),), t.size(1), dtype=torch.long)}


def train_step(m, tokens, kl_weight: float) -> dict:
    """seqvae's training loss on `tokens` (`SeqVAE.loss_terms`, the refinement inside) from
    torch.manual_seed(NOISE_SEED); the refined posteriors after each step, the inner losses, and
    every parameter's gradient before the final clip."""
    record = []
    path = m.refine.path
    m.refine.path = lambda *a, **k: path(*a, **dict(k, record=record))
    try:
        m.train()
        m.zero_grad()
        torch.manual_seed(NOISE_SEED)
        terms = m.loss_terms(batch(tokens), kl_weight)
        terms["loss"].backward()
    finally:
        del m.refine.path
    grads = {k: p.grad.detach().clone() for k, p in m.named_parameters()}
    return {"params": [r["params"] for r in record], "inner_losses": [float(r["f"]) for r in record],
            "loss": float(terms["loss"].detach()), "rec": float(terms["rec"]), "kl": float(terms["kl"]), "grads": grads}  # fmt: skip


def noise(m, tokens, case: dict) -> dict:
    """The draws `train_step` makes, in its order: ε_0..ε_{K-1} (B, Z), then the final ε (B, 1, Z)."""
    b, z, dtype = len(tokens), m.hparams.latent_dim, getattr(torch, case["dtype"])
    torch.manual_seed(NOISE_SEED)
    steps = [torch.randn((b, z), dtype=dtype) for _ in range(case["steps"])]
    return {"steps": steps, "final": torch.randn((b, 1, z), dtype=dtype)}


def evaluate(m, batches: list) -> dict:
    """Per batch: the refined posteriors (a fresh `svi` generator, as the reference's sa_forward pass) and
    IW-NLL from the posteriors refined once, with the `svi` and `iw` generators in the reference's order."""
    from seqvae.core.metrics import iw_nll_from_weights, posterior_iw_log_weights

    m.eval()
    svi, iw = torch.Generator().manual_seed(SVI_SEED), torch.Generator().manual_seed(IW_SEED)
    out = {"iw_nll": [], "refined": []}
    n = CASES["eval"]["iw_samples"]
    for tokens in batches:
        b = batch(tokens)
        with torch.no_grad():
            q, _ = m.encoder.encode(b["tokens"], b["lengths"])
        q = m.refine.evaluated(m, q, b["tokens"], b["lengths"], svi)
        with torch.no_grad():
            ll = lambda z: m.decoder.log_likelihood(b["tokens"], b["lengths"], z)  # noqa: E731
            out["iw_nll"].append(iw_nll_from_weights(posterior_iw_log_weights(ll, q, n, n, iw)))
    svi.manual_seed(SVI_SEED)
    for tokens in batches:
        b = batch(tokens)
        with torch.no_grad():
            q, _ = m.encoder.encode(b["tokens"], b["lengths"])
        out["refined"].append(m.refine.evaluated(m, q, b["tokens"], b["lengths"], svi).params())
    return out


def comparable_grads(grads: dict, vocab_size: int) -> dict:
    """seqvae's gradients in the reference's names, the decoder embedding's last row zeroed: the
    reference's `padding_idx=-1` freezes it (pin_seqvae.train's `frozen_decoder_rows`)."""
    out = {pin_seqvae.TO_REFERENCE[k]: g.clone() for k, g in grads.items()}
    out["decoder.embed.weight"][vocab_size - 1] = 0
    return out


def gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """max |a - b| and that over max |a| (a: the reference)."""
    d = float((a.double() - b.double()).abs().max())
    return d, d / max(float(a.double().abs().max()), 1e-300)


def cosine(a: dict, b: dict, keys) -> float:
    x = torch.cat([a[k].double().flatten() for k in keys])
    y = torch.cat([b[k].double().flatten() for k in keys])
    return float(x @ y / (x.norm() * y.norm()))


def gradient_rows(name: str, ref: dict, ours: dict) -> list[tuple]:
    rows = []
    for side in ("encoder", "decoder"):
        keys = [k for k in ref if k.startswith(side)]
        worst = max((gap(ref[k], ours[k]) for k in keys), key=lambda t: t[1])
        r = torch.cat([ref[k].double().flatten() for k in keys])
        o = torch.cat([ours[k].double().flatten() for k in keys])
        rows.append((f"{name}: {side} gradient (worst tensor)", float(r.norm()), float(o.norm()), *worst))
        rows.append((f"{name}: {side} gradient, cosine / ‖ref − seqvae‖/‖ref‖", cosine(ref, ours, keys),
                     float((r - o).norm() / r.norm()), None, None))  # fmt: skip
    return rows


# ---------------------------------------------------------------- the reference's side
def run_child(work: Path, spec: dict, reuse: bool = False) -> dict:
    if reuse and Path(spec["out"]).is_file():  # the child's output of an earlier run with the same spec
        return dict(torch.load(spec["out"], weights_only=False), seconds=None)
    spec_file = work / f"savae_{spec['case']}.json"
    spec_file.write_text(json.dumps(spec))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    t = time.time()
    p = subprocess.run([sys.executable, str(HERE / "savae_child.py"), str(spec_file)], cwd=work, env=env,
                       capture_output=True, text=True)  # fmt: skip
    if p.returncode:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-5000:])
        raise SystemExit(f"pin_savae: the reference child for case {spec['case']} failed (rc {p.returncode})")
    out = torch.load(spec["out"], weights_only=False)
    out["seconds"] = round(time.time() - t, 1)
    return out


def copy_clone(clone: Path, work: Path) -> str:
    """A copy of the clone's committed files (its HEAD) in `work`; returns the commit."""
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    work.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(clone), "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    return commit


def row(name: str, ref, ours) -> tuple:
    wide = lambda x: x.double() if torch.is_tensor(x) else torch.tensor(x, dtype=torch.float64)  # noqa: E731 (floats: never via fp32)
    a, b = wide(ref), wide(ours)
    return (name, float(a.double().abs().max()), float(b.double().abs().max()), *gap(a, b))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--he", required=True, help="clean work tree of jxhe/vae-lagging-encoder, branch sa-vae")
    ap.add_argument("--work", default="/tmp/seqvae_pin_savae", help="outside the repository")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    ap.add_argument("--reuse", action="store_true", help="read the reference's outputs of an earlier run in --work")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    work = Path(a.work)
    commit = copy_clone(Path(a.he), work / "he") if not a.reuse else subprocess.run(
        ["git", "-C", a.he, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    batches = json.loads(BATCHES.read_text())
    v = batches["vocab_size"]
    fixture = {"provenance": {"references": {"he": {"repository": "jxhe/vae-lagging-encoder", "branch": "sa-vae",
                                                    "commit": commit}},  # fmt: skip
                              "command": "python -m tools.reference pin-sa " + " ".join(argv or sys.argv[1:]),
                              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__},
               "seeds": {"model": MODEL_SEED, "noise": NOISE_SEED, "svi": SVI_SEED, "iw": IW_SEED}, "cases": {}}  # fmt: skip
    rows = []
    for name, case in CASES.items():
        m = model(v, case)
        torch.save(pin_seqvae.to_reference(m.state_dict()), work / f"weights_{name}.pt")
        spec = dict(case, case=name, vocab_size=v, weights=str(work / f"weights_{name}.pt"), out=str(work / f"out_{name}.pt"),
                    network=pin_seqvae.REFERENCE_NETWORK)  # fmt: skip
        if name == "eval":
            tests = [batches["test"][i] for i in case["test_batches"]]
            ref = run_child(work / "he", dict(spec, batches=tests, svi_seed=SVI_SEED, iw_seed=IW_SEED), a.reuse)
            ours = evaluate(m, tests)
            for i in range(len(tests)):
                rows.append(row(f"eval batch {i}: refined mu", ref["refined"][i][0], ours["refined"][i][0]))
                rows.append(row(f"eval batch {i}: refined log σ²", ref["refined"][i][1], ours["refined"][i][1]))
                rows.append(row(f"eval batch {i}: IW-NLL with refinement (K {case['iw_samples']})", ref["iw_nll"][i], ours["iw_nll"][i]))
            fixture["cases"][name] = dict(case, reference={
                "iw_nll": [t.tolist() for t in ref["iw_nll"]], "refined": [[t.tolist() for t in r] for r in ref["refined"]]})
            continue
        tokens = batches["train"][case["train_batch"]]
        torch.save(noise(m, tokens, case), work / f"noise_{name}.pt")
        ref = run_child(work / "he", dict(spec, tokens=tokens, noise=str(work / f"noise_{name}.pt")), a.reuse)
        ours = train_step(m, tokens, case["kl_weight"])
        for k, (r, o) in enumerate(zip(ref["params"][1:], ours["params"])):
            rows.append(row(f"{name}: mu after step {k + 1}", r[0], o[0]))
            rows.append(row(f"{name}: log σ² after step {k + 1}", r[1], o[1]))
        rows.append(row(f"{name}: inner losses f(λ_k), k = 0..{case['steps'] - 1}", ref["inner_losses"], ours["inner_losses"]))
        for key in ("loss", "rec", "kl"):
            rows.append(row(f"{name}: final {key}", ref[key], ours[key]))
        mine = comparable_grads(ours["grads"], v)
        rows += gradient_rows(name, ref["grads"], mine)
        rows.append((f"{name}: the SGD step's direction (all gradients, clipped to 5 together), cosine", cosine(ref["grads"], mine, list(mine)),
                     None, None, None))  # fmt: skip
        rows.append((f"{name}: largest norm clipped in the reference's backward (binds above {case['clip']})",
                     max(ref["clip_norms_backward"]), None, None, None))  # fmt: skip
        fixture["cases"][name] = dict(case, reference={
            "params": [[t.tolist() for t in p] for p in ref["params"][1:]], "inner_losses": ref["inner_losses"],
            "loss": ref["loss"], "rec": ref["rec"], "kl": ref["kl"], "grad_norm": ref["grad_norm"],
            "grads": pin_seqvae.digest(ref["grads"]),  # per tensor: sum, sum of squares, a projection, 64 elements
            "clip_norms_forward": ref["clip_norms_forward"], "clip_norms_backward": ref["clip_norms_backward"],
        })  # fmt: skip
        print(f"# case {name}: reference {ref['seconds']} s", file=sys.stderr)
    table = ["| quantity | reference | seqvae | max abs | max rel |", "|---|---|---|---|---|"]
    fmt = lambda x: "" if x is None else f"{x:.6g}"  # noqa: E731
    table += [f"| {r[0]} | " + " | ".join(fmt(x) for x in r[1:]) + " |" for r in rows]
    print("\n".join(table))
    if not a.no_write:
        FIXTURE.write_text(json.dumps(fixture) + "\n")
        (FIXTURE.parent / "table.md").write_text(f"reference: jxhe/vae-lagging-encoder@{commit} (sa-vae)\n\n" + "\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
