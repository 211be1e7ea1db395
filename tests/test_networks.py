"""Encoder poolings, initialisation and the decoder's likelihood (SPEC §2)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqvae.data import BOS_ID, EOS_ID, PAD_ID
from seqvae.networks import POOLINGS, LSTMDecoder, LSTMEncoder, abs_pool, avg_pool, last_pool, max_pool

V, E, H, Z = 20, 8, 12, 4


def padded_batch(lengths, seed=0):
    """Random `<s> … </s>` sequences; padding positions hold random real token ids, not pad,
    so any leak of padding into a result shows."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    tokens = torch.randint(4, V, (len(lengths), T), generator=g)
    for i, n in enumerate(lengths):
        tokens[i, 0] = BOS_ID
        tokens[i, n - 1] = EOS_ID
    return tokens, torch.tensor(lengths)


LENGTHS = [7, 3, 5, 2, 7]


@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_pooling_ignores_padding(pooling):
    torch.manual_seed(0)
    enc = LSTMEncoder(V, E, H, Z, pooling)
    # larger weights than the init so the features are not all ~0
    for p in enc.parameters():
        torch.nn.init.uniform_(p, -0.5, 0.5)
    tokens, lengths = padded_batch(LENGTHS)
    mu, logvar, h = enc(tokens, lengths)
    for i, n in enumerate(LENGTHS):
        mu1, lv1, h1 = enc(tokens[i : i + 1, :n], torch.tensor([n]))
        torch.testing.assert_close(h[i], h1[0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(mu[i], mu1[0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(logvar[i], lv1[0], atol=1e-6, rtol=1e-5)
    # other ids in the padding: nothing changes
    tokens2 = tokens.clone()
    pad = torch.arange(tokens.size(1)) >= lengths.unsqueeze(1)
    tokens2[pad] = torch.randint(0, V, (int(pad.sum()),), generator=torch.Generator().manual_seed(9))
    assert not torch.equal(tokens, tokens2)
    torch.testing.assert_close(enc(tokens2, lengths)[2], h, atol=0, rtol=0)


@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_pooling_against_lstm_outputs(pooling):
    torch.manual_seed(1)
    enc = LSTMEncoder(V, E, H, Z, pooling)
    for p in enc.parameters():
        torch.nn.init.uniform_(p, -0.5, 0.5)
    tokens, lengths = padded_batch(LENGTHS, seed=2)
    h = enc.features(tokens, lengths)
    for i, n in enumerate(LENGTHS):
        out, (h_n, _) = enc.lstm(enc.embed(tokens[i : i + 1, :n]))
        steps = out[0]  # (n, H), every real step incl. <s> and </s>
        expected = {
            "last": h_n[0, 0],
            "avg": steps.mean(0),
            "max": steps.max(0).values,
            "abs": steps.gather(0, steps.abs().argmax(0, keepdim=True))[0],
        }[pooling]
        torch.testing.assert_close(h[i], expected, atol=1e-6, rtol=1e-5)


def test_last_pool_reads_true_last_step():
    h = torch.arange(2 * 4 * 1, dtype=torch.float).view(2, 4, 1)  # value = 4·b + t
    lengths = torch.tensor([2, 4])
    mask = torch.arange(4) < lengths.unsqueeze(1)
    assert last_pool(h, mask, lengths).flatten().tolist() == [1.0, 7.0]


def test_abs_pool_signed_largest_magnitude_first_on_ties():
    h = torch.tensor(
        [
            [[-3.0, 1.0, 0.5, 2.0], [2.0, -1.0, -0.5, 9.0], [1.0, 0.5, 0.5, -9.0]],
            [[0.1, -0.2, 0.0, 0.0], [-0.4, 0.2, 0.0, 0.0], [-100.0, 100.0, 100.0, -100.0]],  # last step is padding
        ]
    )  # (B=2, T=3, H=4)
    lengths = torch.tensor([3, 2])
    mask = torch.arange(3) < lengths.unsqueeze(1)
    out = abs_pool(h, mask, lengths)
    # dim 0: -3 wins; dim 1: tie 1/-1 -> first (1); dim 2: tie 0.5/-0.5/0.5 -> first (0.5); dim 3: 9/-9 -> 9
    assert out[0].tolist() == [-3.0, 1.0, 0.5, 9.0]
    # padding ignored though it has the largest magnitudes; dim 1 tie -0.2/0.2 -> -0.2; all-zero dims give 0
    assert out[1].tolist() == [pytest.approx(-0.4), pytest.approx(-0.2), 0.0, 0.0]


def test_max_pool_ignores_larger_padding():
    h = torch.tensor([[[-5.0, 1.0], [-2.0, 3.0], [50.0, 50.0]], [[-1.0, -7.0], [-3.0, -6.0], [-2.0, -8.0]]])
    lengths = torch.tensor([2, 3])
    mask = torch.arange(3) < lengths.unsqueeze(1)
    assert max_pool(h, mask, lengths).tolist() == [[-2.0, 3.0], [-1.0, -6.0]]


def test_avg_pool_divides_by_true_length():
    h = torch.tensor([[[1.0], [3.0], [100.0]], [[2.0], [4.0], [9.0]]])
    lengths = torch.tensor([2, 3])
    mask = torch.arange(3) < lengths.unsqueeze(1)
    assert avg_pool(h, mask, lengths).flatten().tolist() == [2.0, 5.0]


def test_init_ranges():
    torch.manual_seed(0)
    for module in (LSTMEncoder(V, E, H, Z, "last"), LSTMDecoder(V, E, H, Z, skip=True), LSTMDecoder(V, E, H, 0)):
        for name, p in module.named_parameters():
            bound = 0.1 if name.startswith("embed.") else 0.01
            assert p.abs().max() <= bound, name
            # actually spread over the range, not e.g. left at zero or at the narrower range
            assert p.abs().max() > 0.5 * bound, name


# ---------------------------------------------------------------- decoder
def decoder(latent_dim=Z, skip=False, seed=0, scale=0.5):
    torch.manual_seed(seed)
    dec = LSTMDecoder(V, E, H, latent_dim, skip=skip)
    for p in dec.parameters():
        torch.nn.init.uniform_(p, -scale, scale)
    return dec.eval()


@pytest.mark.parametrize("skip", [False, True])
def test_log_likelihood_ignores_padding(skip):
    dec = decoder(skip=skip)
    tokens, lengths = padded_batch(LENGTHS, seed=3)
    z = torch.randn(len(LENGTHS), 3, Z, generator=torch.Generator().manual_seed(4))
    ll = dec.log_likelihood(tokens, lengths, z)
    assert ll.shape == (len(LENGTHS), 3)
    for i, n in enumerate(LENGTHS):
        single = dec.log_likelihood(tokens[i : i + 1, :n], torch.tensor([n]), z[i : i + 1])
        torch.testing.assert_close(ll[i], single[0], atol=1e-5, rtol=1e-5)
    tokens2 = tokens.clone()
    pad = torch.arange(tokens.size(1)) >= lengths.unsqueeze(1)
    tokens2[pad] = PAD_ID
    torch.testing.assert_close(dec.log_likelihood(tokens2, lengths, z), ll, atol=0, rtol=0)


def test_log_likelihood_is_gathered_log_softmax_over_n_plus_1_tokens():
    dec = decoder()
    tokens, lengths = padded_batch(LENGTHS, seed=5)
    z = torch.randn(len(LENGTHS), 2, Z, generator=torch.Generator().manual_seed(6))
    ll = dec.log_likelihood(tokens, lengths, z)
    for i, n in enumerate(LENGTHS):
        for k in range(2):
            logits = dec(tokens[i : i + 1, : n - 1], z[i, k : k + 1])[0]  # reads <s> … w_n: (n-1, V)
            targets = tokens[i, 1:n]  # w_1 … </s>, n-1 = (#words + 1) predicted tokens
            assert targets[-1] == EOS_ID and BOS_ID not in targets.tolist()
            expected = F.log_softmax(logits, -1).gather(1, targets.unsqueeze(1)).sum()
            torch.testing.assert_close(ll[i, k], expected, atol=1e-5, rtol=1e-5)


def lstm_by_hand(lstm, x, h, c):
    """One-layer LSTM, gates i, f, g, o as PyTorch orders them. x (T, D), h/c (H,)."""
    outs = []
    for x_t in x:
        gates = lstm.weight_ih_l0 @ x_t + lstm.bias_ih_l0 + lstm.weight_hh_l0 @ h + lstm.bias_hh_l0
        i, f, g, o = gates.chunk(4)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs)


@pytest.mark.parametrize("skip", [False, True])
def test_decoder_wiring_by_hand(skip):
    """Input [emb(x_{t-1}); z] at every step, c0 = W z, h0 = tanh(c0), no bias on the output layer."""
    dec = decoder(skip=skip, seed=7)
    inputs = torch.tensor([[BOS_ID, 5, 9, 13]])
    z = torch.randn(1, Z, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        logits = dec(inputs, z)[0]
        x = torch.cat([dec.embed(inputs[0]), z.expand(4, -1)], -1)
        c0 = dec.z_to_c0.weight @ z[0]
        out = lstm_by_hand(dec.lstm, x, torch.tanh(c0), c0)
        expected = out @ dec.out.weight.T
        if skip:  # logits = W [h; z]: z enters the output layer beside h
            expected = expected + dec.z_to_out.weight @ z[0]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert dec.out.bias is None and dec.z_to_c0.bias is None


def test_z_changes_the_likelihood():
    dec = decoder()
    tokens, lengths = padded_batch([6, 6], seed=9)
    z = torch.randn(2, 2, Z, generator=torch.Generator().manual_seed(10))
    ll = dec.log_likelihood(tokens, lengths, z)
    assert (ll[:, 0] - ll[:, 1]).abs().min() > 1e-3


def test_language_model_has_no_z_path():
    dec = decoder(latent_dim=0, skip=True, seed=11)
    assert dec.z_to_c0 is None and dec.z_to_out is None and not dec.skip
    assert dec.lstm.input_size == E
    assert all(not name.startswith("z_to") for name, _ in dec.named_parameters())
    tokens, lengths = padded_batch(LENGTHS, seed=12)
    ll = dec.log_likelihood(tokens, lengths, None)
    assert ll.shape == (len(LENGTHS), 1)
    for i, n in enumerate(LENGTHS):
        with torch.no_grad():
            out = lstm_by_hand(dec.lstm, dec.embed(tokens[i, : n - 1]), torch.zeros(H), torch.zeros(H))
            expected = F.log_softmax(out @ dec.out.weight.T, -1).gather(1, tokens[i, 1:n, None]).sum()
        torch.testing.assert_close(ll[i, 0], expected, atol=1e-5, rtol=1e-5)


def test_dropout_only_in_training():
    dec = decoder()
    tokens, lengths = padded_batch([6, 4], seed=13)
    z = torch.zeros(2, 1, Z)
    a, b = dec.log_likelihood(tokens, lengths, z), dec.log_likelihood(tokens, lengths, z)
    assert torch.equal(a, b)
    dec.train()
    torch.manual_seed(0)
    c = dec.log_likelihood(tokens, lengths, z)
    assert not torch.allclose(a, c)
