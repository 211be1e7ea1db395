"""Generation from a trained SeqVAE: decoding texts from z (greedy, sampled, beam search), what
`seqvae predict` writes, and the Python API's `reconstruct`, `sample` and `interpolate` (the
model's methods of those names delegate here).

Every random draw of generation (prior z, sampled words) comes from one generator seeded with
`Generation.seed` (predict) or the API's `seed`: the same seed gives the same texts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from seqvae.core.scoring import inference, posterior, text_batches
from seqvae.errors import ConfigError
from seqvae.options import AT_LEAST_ONE, Range, check_option
from seqvae.text.corpus import BOS_ID, EOS_ID

Decoding = Literal["greedy", "sample", "beam"]


@dataclass(frozen=True)
class Generation:
    """What `seqvae predict` writes, one text per line (`--model.generation.mode …`).

    Args:
        mode: "reconstruct" decodes each input text (`data.predict`, default the test split)
            from its posterior mean, line n of predictions.txt for input line n (an empty line
            for an empty input line, and for a test-split line over data.max_length); "sample"
            decodes `n` texts from z ~ N(0, I) (no input text is decoded); "interpolate" reads
            the non-empty input lines as pairs (1st-2nd, 3rd-4th, …) and decodes `steps` points
            on the straight line between each pair's posterior means, both ends included
            (`steps` lines per pair).
        decoding: "greedy" (the most probable word at each step), "sample" (from
            softmax(logits / temperature)) or "beam" (beam search, `LSTMDecoder.beam_search`).
            Default: "sample" when a temperature > 0 is given, "beam" when a beam_width is,
            "greedy" otherwise.
        temperature: Softmax temperature of decoding "sample" (default 1.0); refused with
            another decoding, which would ignore it.
        beam_width: Hypotheses kept by decoding "beam" (default 5; 1 is greedy); refused with
            another decoding.
        n: Texts drawn in mode "sample".
        steps: Points per pair in mode "interpolate".
        max_length: Most tokens decoded per text (`</s>` included); default: the batch's longest
            input + 20 in mode "reconstruct", 100 otherwise.
        seed: Seed of every random draw of generation (prior z, sampled words): the same seed
            gives the same texts.
        stdout: Also print the texts to stdout (predictions.txt is always written).
    """

    mode: Literal["reconstruct", "sample", "interpolate"] = "reconstruct"
    decoding: Decoding | None = None
    temperature: float | None = None
    beam_width: int | None = None
    n: int = 10
    steps: int = 5
    max_length: int | None = None
    seed: int = 0
    stdout: bool = False

    option_ranges = {"n": AT_LEAST_ONE, "steps": Range(lambda v: v >= 2, ">= 2 (both ends)"), "max_length": AT_LEAST_ONE}

    def resolved(self, prefix: str = "model.generation.") -> Generation:
        """This with `decoding`, `temperature` and `beam_width` filled in (`decoding_settings`),
        after refusing an out-of-range count (n 0 would write an empty file, steps 1 only the
        first end of each pair, max_length 0 empty texts)."""
        for name, allowed in self.option_ranges.items():
            check_option(prefix + name, getattr(self, name), allowed)
        decoding, temperature, beam_width = decoding_settings(self.decoding, self.temperature, self.beam_width, prefix)
        return replace(self, decoding=decoding, temperature=temperature, beam_width=beam_width)


DEFAULTS = Generation()  # the CLI's defaults, which the Python API shares
TEMPERATURE, BEAM_WIDTH = 1.0, 5  # decoding "sample" and "beam" without their setting
PRIOR_MAX_LENGTH = 100  # most tokens decoded from the prior or a path, where no input says how long
LENGTH_MARGIN = 20  # a reconstruction may run this many tokens past its batch's longest input


def default_max_length(lengths: torch.Tensor | None) -> int:
    """max_length when none is given: the longest input of the batch (`<s>`, `</s>` counted) +
    LENGTH_MARGIN for reconstructions (lengths given), PRIOR_MAX_LENGTH otherwise."""
    return PRIOR_MAX_LENGTH if lengths is None else int(lengths.max()) + LENGTH_MARGIN


def decoding_settings(
    decoding: str | None, temperature: float | None, beam_width: int | None, prefix: str = ""
) -> tuple[str, float | None, int | None]:
    """(decoding, temperature, beam_width) as decoded, from what was given (None: not given).
    Without a decoding, a temperature means sampling (0: greedy, its limit) and a beam width
    beam search. A setting that the decoding would ignore is refused rather than dropped: a
    temperature with greedy decoding gives greedy texts where the user asked for samples.
    `prefix` names the options in errors (`model.generation.` for `seqvae predict`)."""
    if temperature is not None and not temperature >= 0:  # NaN too
        raise ConfigError(f"{prefix}temperature: must be >= 0 (0: greedy), got {temperature}")
    if decoding is None:
        if temperature is not None and beam_width is not None:
            raise ConfigError(f"{prefix}temperature and {prefix}beam_width: give {prefix}decoding (sample or beam)")
        if temperature is not None:
            decoding = "sample" if temperature > 0 else "greedy"
            temperature = temperature if temperature > 0 else None
        else:
            decoding = "greedy" if beam_width is None else "beam"
    if decoding not in ("greedy", "sample", "beam"):
        raise ConfigError(f"{prefix}decoding must be greedy, sample or beam, got {decoding!r}")
    for name, value, used_by in (("temperature", temperature, "sample"), ("beam_width", beam_width, "beam")):
        if value is not None and decoding != used_by:
            raise ConfigError(f"{prefix}{name} {value}: only decoding '{used_by}' uses it, and {prefix}decoding is '{decoding}'")
    if decoding == "sample":
        temperature = TEMPERATURE if temperature is None else temperature
        if not temperature > 0:
            raise ConfigError(f"{prefix}temperature: decoding 'sample' needs a temperature > 0, got {temperature}")
    if decoding == "beam":
        beam_width = BEAM_WIDTH if beam_width is None else beam_width
        if beam_width < 1:
            raise ConfigError(f"{prefix}beam_width: decoding 'beam' needs beam_width >= 1, got {beam_width}")
    return decoding, temperature, beam_width


def decode(model, z, n: int, max_length: int, decoding: str, temperature: float, beam_width: int, generator=None):
    """Texts decoded from z (n, Z) (None: the language model) by greedy, sampling or beam search."""
    if decoding == "beam":
        ids = model.decoder.beam_search(z, n, BOS_ID, EOS_ID, max_length, beam_width)[0]
    else:
        t = temperature if decoding == "sample" else 0.0
        ids = model.decoder.generate(z, n, BOS_ID, EOS_ID, max_length, t, generator)
    return [model.vocab.decode(row.tolist()) for row in ids]


def decode_prior(model, n: int, max_length: int, decoding: str, temperature: float, beam_width: int, generator=None):
    """n texts decoded from z ~ N(0, I) (the language model: from nothing)."""
    z = None
    if model.encoder is not None:
        z = torch.randn(n, model.hparams.latent_dim, device=model.device, generator=generator)
    return decode(model, z, n, max_length, decoding, temperature, beam_width, generator)


def line(a: torch.Tensor, b: torch.Tensor, steps: int) -> torch.Tensor:
    """`steps` evenly spaced points from a to b (Z,), both included: (steps, Z)."""
    weights = torch.linspace(0, 1, steps, device=a.device, dtype=a.dtype).unsqueeze(1)
    return (1 - weights) * a + weights * b


def lines_of_file(outputs: list[str], source) -> list[str]:
    """One output per line of the input file's span read (`Corpus.lines_read`): output i at the
    line of kept text i, an empty line where the reader skipped one (empty; for the test split
    also over data.max_length), so that output line n answers input line n."""
    first, last = source.lines_read
    by_line = dict(zip(source.line_numbers, outputs))
    return [by_line.get(number, "") for number in range(first, last + 1)]


def read_predict_inputs(model, dm) -> tuple[str, ...]:
    """`seqvae predict`'s input file read (a bad one stops here, before the run directory exists):
    the split whose data line is printed; none when sampling from the prior."""
    dm.prior_only = model.generation.mode == "sample"
    if dm.prior_only or not (dm.hparams.predict or dm.splits["test"] is not None):
        return ()
    dm.predict_corpus() if dm.hparams.predict else dm.read_splits(["test"])
    return ("predict",) if dm.hparams.predict else ("test",)


def predicted_lines(predictions: list[list[str]], model, dm) -> tuple[list[str], int, str]:
    """The generated texts as predictions.txt holds them: a reconstruction of a file gets one line
    per input line (empty where it had no text). Returns (lines, texts generated, what to say of
    the empty lines)."""
    lines = [t for batch in predictions for t in batch]
    n_texts, blank = len(lines), ""
    source = dm.predict_source() if model.generation.mode == "reconstruct" else None
    if source is not None and len(lines) == len(source.texts):
        lines = lines_of_file(lines, source)
        if len(lines) > n_texts:
            blank = f"; {len(lines) - n_texts} empty lines for input lines without a text to reconstruct"
    return lines, n_texts, blank


def check_predict_inputs(model, dm) -> None:
    """`seqvae predict`'s input texts checked once they are read and before the run directory
    exists (a refusal inside the predict loop left a version_N behind, one more per retry): none
    to decode, or interpolation without a latent space or pairs."""
    g = model.generation
    if g.mode == "sample":
        return
    h = dm.hparams
    if not (h.predict or h.test or h.train):
        raise ConfigError("data.predict: no input texts (give --data.predict FILE; mode sample ignores them)")
    source = dm.predict_source()
    if g.mode == "interpolate":
        if model.encoder is None:
            raise ConfigError("model.generation.mode: the language model has no latent space to interpolate in")
        if source is not None and len(source.texts) % 2:
            raise ConfigError(
                f"model.generation.mode interpolate reads pairs of lines; the predict texts have {len(source.texts)}"
            )


class Predictor:
    """`seqvae predict`: the texts of `model.generation` for each batch of inputs, in input order
    (a collapsed model gives the same text for every input, visibly)."""

    def __init__(self, model):
        g = model.generation
        if g.mode == "interpolate":
            if model.encoder is None:
                raise ConfigError("model.generation.mode: the language model has no latent space to interpolate in")
            loaders = model.trainer.predict_dataloaders
            n_texts = sum(len(dl.dataset) for dl in (loaders if isinstance(loaders, (list, tuple)) else [loaders]))
            if n_texts % 2:
                raise ConfigError(f"model.generation.mode interpolate reads pairs of lines; the predict texts have {n_texts}")
        self.model, self.generation = model, g.resolved()
        self.generator = torch.Generator(device=model.device).manual_seed(g.seed)
        self.pending_mu = None  # interpolation: the first text of a pair split across batches

    def step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> list[str]:
        g, gen, model = self.generation, self.generator, self.model
        tokens, lengths = batch["tokens"], batch["lengths"]
        if g.mode == "sample":
            if batch_idx or dataloader_idx:
                return []
            return decode_prior(model, g.n, g.max_length or PRIOR_MAX_LENGTH, g.decoding, g.temperature, g.beam_width, gen)
        z = posterior(model, tokens, lengths, gen).mean if model.encoder is not None else None
        if g.mode == "interpolate":
            if self.pending_mu is not None:
                z, self.pending_mu = torch.cat([self.pending_mu, z]), None
            if z.size(0) % 2:
                z, self.pending_mu = z[:-1], z[-1:]
            if not z.size(0):
                return []
            z = torch.cat([line(a, b, g.steps) for a, b in zip(z[0::2], z[1::2])])
        n = tokens.size(0) if z is None else z.size(0)
        max_length = g.max_length or default_max_length(lengths if g.mode == "reconstruct" else None)
        return decode(model, z, n, max_length, g.decoding, g.temperature, g.beam_width, gen)


# ---------------------------------------------------------------- the Python API
# Same defaults as `seqvae predict` (DEFAULTS): greedy decoding, reconstructions up to the
# batch's longest input + 20 tokens, prior samples and paths up to 100; decoding as
# `decoding_settings` fills it in.


def _generator(model, seed: int | None):
    return None if seed is None else torch.Generator(device=model.device).manual_seed(seed)


def reconstruct(model, texts, temperature=None, max_length=None, batch_size=64, decoding=None, beam_width=None, seed=None):
    decoding, temperature, beam_width = decoding_settings(decoding, temperature, beam_width)
    gen, out = _generator(model, seed), []
    with inference(model):
        for b in text_batches(model, list(texts), batch_size):
            z = posterior(model, b["tokens"], b["lengths"], gen).mean if model.encoder is not None else None
            length = max_length or default_max_length(b["lengths"])
            out += decode(model, z, b["tokens"].size(0), length, decoding, temperature, beam_width, gen)
    return out


def interpolate(model, a, b, steps=DEFAULTS.steps, max_length=None, temperature=None, decoding=None, beam_width=None, seed=None):
    if model.encoder is None:
        raise RuntimeError("the language model has no latent space to interpolate in")
    decoding, temperature, beam_width = decoding_settings(decoding, temperature, beam_width)
    gen = _generator(model, seed)
    with inference(model):
        batch = next(text_batches(model, [a, b], 2))
        # the two posteriors' means in the space the decoder reads (through a flow, after SA-VAE's steps), as predict's
        ends = posterior(model, batch["tokens"], batch["lengths"], gen).mean
        z = line(ends[0], ends[1], steps)
        length = max_length or PRIOR_MAX_LENGTH
        return decode(model, z, steps, length, decoding, temperature, beam_width, gen)


def sample(model, n, temperature=None, max_length=None, decoding=None, beam_width=None, seed=None):
    if model.vocab is None:
        raise RuntimeError("this model has no vocabulary: load it from a checkpoint or train it first")
    decoding, temperature, beam_width = decoding_settings(decoding, temperature, beam_width)
    with inference(model):
        length = max_length or PRIOR_MAX_LENGTH
        return decode_prior(model, n, length, decoding, temperature, beam_width, _generator(model, seed))
