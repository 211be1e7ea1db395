"""Encoder poolings, initialisation and the decoder's likelihood (SPEC §2)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqvae.core.features import POOLINGS, abs_pool, avg_pool, last_pool, max_pool
from seqvae.core.model import SeqVAE
from seqvae.core.networks import LSTMDecoder, LSTMEncoder
from seqvae.text.datamodule import BOS_ID, EOS_ID, PAD_ID

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


def test_pytorch_init_keeps_the_fan_in_defaults():
    torch.manual_seed(0)
    for module in (LSTMEncoder(V, E, H, Z, "last", init="pytorch"), LSTMDecoder(V, E, H, Z, skip=True, init="pytorch")):
        for name, p in module.named_parameters():
            if name.startswith("embed."):
                bound = 0.1
            elif "lstm" in name:
                bound = H**-0.5  # nn.LSTM: U(-1/√hidden, 1/√hidden)
            else:
                bound = p.size(1) ** -0.5  # nn.Linear: U(-1/√fan_in, 1/√fan_in)
            assert 0.5 * bound < p.abs().max() <= bound, name
    with pytest.raises(ValueError, match="init must be"):
        LSTMEncoder(V, E, H, Z, "last", init="xavier")


def topic_batch(n, generator):
    """`<s> w w w w </s>` with w one of 4 words: the LSTM-LM's best is ln 4 nats per text (the
    first word), an autoencoder that encodes w in z reaches 0."""
    tokens = torch.full((n, 6), EOS_ID)
    tokens[:, 0] = BOS_ID
    tokens[:, 1:5] = torch.randint(4, 8, (n, 1), generator=generator)
    return {"tokens": tokens, "lengths": torch.full((n,), 6)}


@pytest.mark.parametrize("init", ["reference", "pytorch"])
def test_encoder_init_decides_whether_an_autoencoder_encodes(init):
    """The SeqVAE loss at KL weight 0 (an autoencoder), SGD lr 1, clip 5 (He et al.'s optimiser),
    1,500 updates. With PyTorch's init the encoder learns the 2 bits; at the reference's
    U(-0.01, 0.01) its features and posterior layer start near a saddle (each one's gradient is
    scaled by the other, both ~0.01) and SGD does not leave it: rec stays at the LM's ln 4."""
    torch.manual_seed(0)
    model = SeqVAE(8, embed_dim=16, hidden_dim=32, latent_dim=4, dropout_in=0.0, dropout_out=0.0, init=init)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    g = torch.Generator().manual_seed(0)
    for _ in range(1500):
        loss = model.loss_terms(topic_batch(32, g), kl_weight=0.0)["loss"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
    model.eval()
    with torch.no_grad():
        batch = topic_batch(256, g)
        mu, _, _ = model.encoder(batch["tokens"], batch["lengths"])
        rec = -model.decoder.log_likelihood(batch["tokens"], batch["lengths"], mu.unsqueeze(1))[:, 0].mean()
    if init == "pytorch":
        assert rec < 0.1 and mu.std(0).max() > 0.5
    else:
        assert abs(rec - torch.log(torch.tensor(4.0))) < 0.1 and mu.std(0).max() < 0.01


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


# ---------------------------------------------------------------- beam search
def sequence_log_prob(dec, ids, z):
    """Teacher-forced log p(ids | z) of decoded rows (n, L): up to and including the first
    `</s>`, or all L tokens when there is none."""
    n = ids.size(0)
    ends = [int((row == EOS_ID).nonzero()[0]) + 1 if bool((row == EOS_ID).any()) else len(row) for row in ids]
    tokens = torch.cat([torch.full((n, 1), BOS_ID), ids], dim=1)
    lengths = torch.tensor(ends) + 1
    with torch.no_grad():
        return dec.log_likelihood(tokens, lengths, None if z is None else z.unsqueeze(1))[:, 0]


@pytest.mark.parametrize("latent_dim,skip", [(Z, False), (Z, True), (0, False)])
def test_beam_width_1_is_greedy(latent_dim, skip):
    for seed in range(3):
        dec = decoder(latent_dim, skip, seed=seed, scale=1.0)
        z = torch.randn(6, latent_dim, generator=torch.Generator().manual_seed(seed)) if latent_dim else None
        greedy = dec.generate(z, 6, BOS_ID, EOS_ID, max_length=15)
        beam, score = dec.beam_search(z, 6, BOS_ID, EOS_ID, max_length=15, beam_width=1)
        assert torch.equal(beam, greedy)
        torch.testing.assert_close(score, sequence_log_prob(dec, beam, z), atol=1e-4, rtol=1e-5)


class MarkovDecoder(LSTMDecoder):
    """A decoder whose next-word distribution depends on the previous word only (a table)."""

    def __init__(self, table):
        super().__init__(len(table), 2, 2, 0)
        self.table = torch.tensor(table).log()

    def _step(self, x, state, z):
        return self.table[x], state


def test_beam_search_beats_myopic_greedy():
    A, B = 4, 5  # after <s>: A 0.6, B 0.4; after A: four words at 0.25; after B: </s> for sure
    eps = 1e-9
    table = [[1 / 6] * 6 for _ in range(6)]
    table[BOS_ID] = [eps, eps, eps, eps, 0.6, 0.4]
    table[A] = [eps, eps, 0.25, 0.25, 0.25, 0.25]
    table[B] = [eps, eps, 1.0, eps, eps, eps]
    dec = MarkovDecoder(table).eval()
    greedy = dec.generate(None, 1, BOS_ID, EOS_ID, max_length=2)
    assert greedy[0, 0] == A  # greedy takes the likelier first word, then nothing is likely
    ids, score = dec.beam_search(None, 1, BOS_ID, EOS_ID, max_length=5, beam_width=2)
    assert ids[0].tolist() == [B, EOS_ID]
    assert float(score) == pytest.approx(torch.tensor(0.4).log().item() + torch.tensor(1.0).log().item(), abs=1e-6)
    ids1, score1 = dec.beam_search(None, 1, BOS_ID, EOS_ID, max_length=5, beam_width=1)
    assert ids1[0, 0] == A and float(score1) < float(score)


@pytest.mark.parametrize("latent_dim,skip", [(Z, False), (0, False), (Z, True)])
def test_wide_beam_finds_the_exact_optimum(latent_dim, skip):
    """With a beam as wide as every prefix, beam search is exhaustive: it must return the most
    probable sequence of all (enumerated) and its score, which no greedy decode can beat."""
    import itertools

    v, max_len = 6, 4
    torch.manual_seed(1)
    dec = LSTMDecoder(v, 4, 6, latent_dim, skip=skip)
    for p in dec.parameters():
        torch.nn.init.uniform_(p, -1.5, 1.5)
    dec.eval()
    z = torch.randn(2, latent_dim, generator=torch.Generator().manual_seed(2)) if latent_dim else None
    words = [t for t in range(v) if t != EOS_ID]
    candidates = [list(p) + [EOS_ID] for k in range(max_len) for p in itertools.product(words, repeat=k)]
    candidates += [list(p) for p in itertools.product(words, repeat=max_len)]
    padded = torch.tensor([c + [EOS_ID] * (max_len - len(c)) for c in candidates])
    ids, score = dec.beam_search(z, 2, BOS_ID, EOS_ID, max_length=max_len, beam_width=v ** (max_len - 1))
    greedy = dec.generate(z, 2, BOS_ID, EOS_ID, max_length=max_len)
    for i in range(2):
        zi = None if z is None else z[i : i + 1].expand(len(candidates), -1)
        all_scores = sequence_log_prob(dec, padded, zi)
        best = int(all_scores.argmax())
        assert ids[i, : len(candidates[best])].tolist() == candidates[best]
        assert float(score[i]) == pytest.approx(float(all_scores[best]), abs=1e-4)
        greedy_score = sequence_log_prob(dec, greedy[i : i + 1], None if z is None else z[i : i + 1])
        assert float(score[i]) >= float(greedy_score) - 1e-5


def test_beam_search_batched_equals_one_by_one():
    dec = decoder(Z, seed=4, scale=1.0)
    z = torch.randn(5, Z, generator=torch.Generator().manual_seed(5))
    ids, score = dec.beam_search(z, 5, BOS_ID, EOS_ID, max_length=12, beam_width=4)
    for i in range(5):
        one, s = dec.beam_search(z[i : i + 1], 1, BOS_ID, EOS_ID, max_length=12, beam_width=4)
        n = one.size(1)
        assert ids[i, :n].tolist() == one[0].tolist() and torch.all(ids[i, n:] == EOS_ID)
        assert float(score[i]) == pytest.approx(float(s[0]), abs=1e-4)
        torch.testing.assert_close(score[i : i + 1], sequence_log_prob(dec, ids[i : i + 1], z[i : i + 1]), atol=1e-4, rtol=1e-5)
