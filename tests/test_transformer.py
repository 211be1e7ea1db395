"""The Transformer encoder (issue 38): masks, the [CLS] feature, its options' errors, the encoder
swap through the CLI end to end (fit, test from the checkpoint, probe, a pretrained encoder
with aggressive training and free bits), with the LSTM path unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_scoring import run

from seqvae import SeqVAE, TransformerEncoder
from seqvae.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SMALL = TransformerEncoder(d_model=16, layers=2, heads=2, dropout=0.0)


def model(pooling: str, encoder=SMALL, **kw) -> SeqVAE:
    torch.manual_seed(0)
    return SeqVAE(vocab_size=40, embed_dim=8, hidden_dim=12, latent_dim=4, pooling=pooling, encoder=encoder, **kw).eval()


def batch():
    """Three texts of lengths 7, 5 and 3 (`<s>` = 2 first), padded to 7 with 0."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, 40, (3, 7), generator=g)
    tokens[:, 0] = 2
    lengths = torch.tensor([7, 5, 3])
    tokens[1, 5:] = tokens[2, 3:] = 0
    return tokens, lengths


@pytest.mark.parametrize("pooling", ["cls", "last", "avg", "max", "abs"])
def test_padding_never_changes_a_feature(pooling):
    net = model(pooling).encoder
    tokens, lengths = batch()
    with torch.no_grad():
        mu, logvar, h = net(tokens, lengths)
        other = tokens.clone()
        other[1, 5:], other[2, 3:] = 17, 33  # other ids where the padding is
        longer = torch.cat([tokens, torch.zeros(3, 5, dtype=torch.long)], 1)  # 5 more padding steps
        for t in (other, longer):
            mu2, logvar2, h2 = net(t, lengths)
            torch.testing.assert_close(h2, h, atol=1e-5, rtol=0)
            torch.testing.assert_close(mu2, mu, atol=1e-5, rtol=0)
        # each text alone, unpadded: the same feature as in the padded batch
        for i, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(net(tokens[i : i + 1, :n], lengths[i : i + 1])[2], h[i : i + 1], atol=1e-5, rtol=0)
    assert h.shape == (3, 16) and mu.shape == logvar.shape == (3, 4)


def test_the_cls_feature_is_the_output_at_the_first_token_and_the_others_pool_the_real_steps():
    tokens, lengths = batch()
    outs = {}
    for pooling in ("cls", "last", "avg", "max", "abs"):
        net = model(pooling).encoder
        with torch.no_grad():
            mask = torch.arange(7) < lengths.unsqueeze(1)
            out = net.layers(net.embed(tokens) + net.position.weight[:7], src_key_padding_mask=~mask)  # (B, T, d)
            outs[pooling] = net.features(tokens, lengths)
    torch.testing.assert_close(outs["cls"], out[:, 0])
    torch.testing.assert_close(outs["last"], out[torch.arange(3), lengths - 1])
    expected_avg = torch.stack([out[i, :n].mean(0) for i, n in enumerate(lengths.tolist())])
    torch.testing.assert_close(outs["avg"], expected_avg)
    torch.testing.assert_close(outs["max"], torch.stack([out[i, :n].amax(0) for i, n in enumerate(lengths.tolist())]))
    for i, n in enumerate(lengths.tolist()):  # abs: the value of largest magnitude, sign kept
        real = out[i, :n]
        torch.testing.assert_close(outs["abs"][i], real.gather(0, real.abs().argmax(0, keepdim=True))[0])
    assert not torch.allclose(outs["cls"], outs["last"])  # attention is not causal: <s> sees the text, but is not its end


def test_bn_vae_and_the_posterior_layer_are_the_lstms():
    net = model("avg", bn_gamma=0.6).encoder
    assert isinstance(net.mean_norm, torch.nn.BatchNorm1d) and not net.mean_norm.weight.requires_grad
    assert torch.all(net.mean_norm.weight == 0.6) and net.to_posterior.weight.abs().max() <= 0.01  # reference init
    pytorch_init = model("avg", init="pytorch").encoder.to_posterior.weight.abs().max()
    assert pytorch_init > 0.05  # PyTorch's U(±1/√16)
    for p in (m for m in model("avg").encoder.modules() if isinstance(m, torch.nn.LayerNorm)):
        assert torch.all(p.weight == 1.0)  # not He et al.'s U(-0.01, 0.01): LayerNorm gains stay 1


@pytest.mark.parametrize("build, says", [
    (lambda: model("cls", TransformerEncoder(d_model=10, heads=4)), "init_args.heads: 4 does not divide d_model 10"),
    (lambda: model("cls", TransformerEncoder(layers=0)), "model.encoder.init_args.layers"),
    (lambda: model("cls", TransformerEncoder(dropout=1.0)), "model.encoder.init_args.dropout"),
    (lambda: model("cls", TransformerEncoder(optimizer="adamw")), "model.encoder.init_args.optimizer: must be sgd or adam"),
    (lambda: model("cls", TransformerEncoder(lr=0.0)), "model.encoder.init_args.lr"),
    (lambda: model("cls", None), "model.pooling: 'cls' is not an LSTM encoder's feature"),
    (lambda: model("max", SMALL, encoder_hidden_dim=32), "model.encoder_hidden_dim"),
])  # fmt: skip
def test_bad_settings_are_one_config_error_naming_the_option(build, says):
    with pytest.raises(ConfigError, match=None) as err:
        build()
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_encoder_takes_its_own_optimiser_and_the_decoder_keeps_sgd_at_model_lr():
    def optimisers(encoder):
        m = model("cls", encoder, lr=0.5)
        return [(type(o).__name__, o.param_groups[0]["lr"], sum(p.numel() for p in o.param_groups[0]["params"]))
                for o in m.configure_optimizers()]  # fmt: skip

    sizes = [sum(p.numel() for p in part.parameters()) for part in (model("cls").encoder, model("cls").decoder)]
    assert optimisers(SMALL) == [("SGD", 0.5, sizes[0]), ("SGD", 0.5, sizes[1])]  # He et al.'s protocol by default
    adam = TransformerEncoder(d_model=16, layers=2, heads=2, optimizer="adam", lr=3e-4)
    assert optimisers(adam) == [("Adam", 3e-4, sizes[0]), ("SGD", 0.5, sizes[1])]
    old = TransformerEncoder(d_model=16, layers=2, heads=2)
    del old.optimizer, old.lr  # settings pickled before the two options existed
    assert optimisers(old)[0] == ("SGD", 0.5, sizes[0])


def test_a_text_longer_than_the_positions_is_refused_naming_max_length():
    net = model("cls", TransformerEncoder(d_model=16, heads=2, max_length=5)).encoder
    tokens, lengths = batch()
    with pytest.raises(ConfigError, match=r"model.encoder.init_args.max_length: a batch of 7 tokens"):
        net(tokens, lengths)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("transformer")
    words = ["bad awful", "poor meh", "fine okay", "good nice", "great superb"]
    path = root / "reviews.txt"
    path.write_text("".join(f"{i % 5} the food was {words[i % 5]} w{i % 13} end\n" for i in range(1, 81)))
    common = ["--config", REPO / "configs/demo.yaml", "--config", REPO / "configs/transformer/encoder.yaml",
              f"--data.train={path}#1-50", f"--data.val={path}#51-60", f"--data.test={path}#61-80",
              "--data.label_column=first_token", "--model.embed_dim=8", "--model.hidden_dim=12", "--model.latent_dim=4",
              "--model.encoder.init_args.d_model=16", "--model.encoder.init_args.heads=2", "--model.val_iw_samples=0",
              "--model.test_iw_samples=2", "--trainer.max_epochs=1", "--trainer.enable_model_summary=false",
              "--trainer.num_sanity_val_steps=0", f"--trainer.logger.init_args.save_dir={root}"]  # fmt: skip
    return root, common


def test_the_encoder_swap_end_to_end_fit_test_probe_and_a_pretrained_encoder(corpus, capsys):
    root, common = corpus
    status, err = run(["fit", *common, "--trainer.logger.init_args.version=cls"], capsys)
    assert status == 0, err
    run_dir = root / "transformer_cls" / "cls"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["test/au"] >= 0 and metrics["test/iw_nll"] > 0
    config = (run_dir / "config.yaml").read_text()
    assert "class_path: seqvae.TransformerEncoder" in config and "d_model: 16" in config and "pooling: cls" in config
    ckpt = run_dir / "checkpoints" / "best.ckpt"
    from seqvae.store.checkpoints import load_checkpoint

    hparams = load_checkpoint(ckpt, "test")["hyper_parameters"]  # the CLI keeps the strategy as its config
    assert hparams["encoder"]["class_path"] == "seqvae.TransformerEncoder" and hparams["encoder"]["init_args"]["d_model"] == 16
    reloaded = SeqVAE.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True)
    assert isinstance(reloaded.encoder.layers, torch.nn.TransformerEncoder) and reloaded.encoder.feature_dim == 16
    status, err = run(["fit", *common, "--config", REPO / "configs/transformer/adam.yaml",
                       "--trainer.logger.init_args.version=adam"], capsys)  # fmt: skip
    assert status == 0, err
    states = torch.load(root / "transformer_cls" / "adam" / "checkpoints" / "last.ckpt", weights_only=False)["optimizer_states"]
    assert "exp_avg" in next(iter(states[0]["state"].values())) and not states[1]["state"]  # Adam encoder, SGD decoder
    status, err = run(["probe", run_dir, "--sizes", "10", "--draws", "2"], capsys)
    assert status == 0, err
    assert json.loads((run_dir / "probe.json").read_text())["latent_dim"] == 4
    # stage 2 of the recipe on it: its encoder's weights, free bits, aggressive encoder steps, max pooling's shapes agree
    stage2 = [*common, f"--model.init_encoder_from={ckpt}", "--model.pooling=max", "--trainer.logger.init_args.version=fb",
              "--model.kl_penalty=seqvae.FreeBits", "--model.kl_penalty.target=1.0",
              "--model.aggressive=seqvae.AggressiveTraining", "--model.aggressive.max_inner_steps=2"]  # fmt: skip
    status, err = run(["fit", *stage2], capsys)
    assert status == 0, err
    fb = json.loads((root / "transformer_cls" / "fb" / "metrics.json").read_text())
    assert fb["encoder_updates"] > fb["decoder_updates"]  # the aggressive phase stepped the encoder alone
    # another width cannot take that encoder: one line naming the option and the tensor
    status, err = run(["fit", *stage2, "--model.encoder.init_args.d_model=32", "--trainer.logger.init_args.version=bad"], capsys)
    assert status == 2 and "model.init_encoder_from" in err and "encoder.embed.weight" in err


def test_a_python_api_model_saves_its_encoder_settings_and_loads_with_weights_only(tmp_path):
    from seqvae.store.checkpoints import load_checkpoint

    m = model("max")
    torch.save({"hyper_parameters": dict(m.hparams), "state_dict": m.state_dict()}, tmp_path / "api.ckpt")
    loaded = load_checkpoint(tmp_path / "api.ckpt", "ckpt")
    again = SeqVAE(**loaded["hyper_parameters"])
    again.load_state_dict(loaded["state_dict"])
    tokens, lengths = batch()
    torch.testing.assert_close(again.eval().encoder(tokens, lengths)[0], m.encoder(tokens, lengths)[0])
