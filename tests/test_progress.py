"""TestProgress (`seqvae test`'s line at every tenth of the work) on a fake clock: work counted as
padded tokens × decoder passes (K importance samples + 1), and no two lines within
`min_interval` seconds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from seqvae.text.corpus import IndexedTexts, collate
from seqvae.text.datamodule import SAMPLERS
from seqvae.training import log_lines
from seqvae.training.log_lines import TestProgress, clock


def run(monkeypatch, capsys, lengths, seconds_of, k=None, batch_size=2, **kwargs):
    """Lines over a bucketed test of texts of these lengths; batch i takes seconds_of(tokens) s."""
    data = IndexedTexts([torch.full((n,), 7) for n in lengths])
    loader = DataLoader(data, batch_sampler=SAMPLERS["bucket"](lengths, batch_size, False), collate_fn=collate)
    trainer = SimpleNamespace(test_dataloaders=loader, is_global_zero=True)
    module = None if k is None else SimpleNamespace(hparams=SimpleNamespace(test_iw_samples=k))
    now = [0.0]
    monkeypatch.setattr(log_lines.time, "monotonic", lambda: now[0])
    progress = TestProgress(**kwargs)
    progress.on_test_epoch_start(trainer, module)
    ends = []
    for i, batch in enumerate(loader):
        now[0] += seconds_of(batch["tokens"])
        ends.append(now[0])
        progress.on_test_batch_end(trainer, module, None, batch, i)
    header, *lines = capsys.readouterr().err.splitlines()
    iw = f"IW-NLL with K = {k} importance samples per text" if k else "no IW-NLL (model.test_iw_samples 0)"
    assert header == f"seqvae: test: {len(lengths)} texts, {iw}"  # said before any work, whatever the quiet time
    return lines, ends


def parse(line: str) -> tuple[int, float, float]:
    """(percent, elapsed s, left s) of a progress line."""
    words = line.split()
    to_s = lambda c: sum(int(x) * 60**i for i, x in enumerate(reversed(c.removeprefix("~").split(":"))))  # noqa: E731
    return int(words[2].rstrip("%")), to_s(words[5]), to_s(words[7])


def test_work_is_padded_tokens_times_k_plus_one():
    assert TestProgress.passes(SimpleNamespace(hparams=SimpleNamespace(test_iw_samples=500))) == 501
    assert TestProgress.passes(SimpleNamespace(hparams=SimpleNamespace(test_iw_samples=0))) == 1  # no IW-NLL
    assert TestProgress.passes(None) == TestProgress.passes(SimpleNamespace()) == 1
    progress = TestProgress()
    progress._passes = 101
    assert progress.work(32, 20) == 32 * 20 * 101


@pytest.mark.parametrize("k", [None, 0, 100])
def test_time_left_is_exact_when_cost_is_tokens_times_passes(monkeypatch, capsys, k):
    # texts sorted by length (bucketed, evaluated in length order): the long ones come last.
    # If a batch costs (texts × longest) × (K + 1) units, the estimate is the true time left.
    lengths = [3] * 20 + [8] * 20 + [20] * 10 + [60] * 6 + [200] * 4
    passes = 1 + (k or 0)
    cost = lambda tokens: tokens.numel() * passes * 1.0  # noqa: E731
    lines, ends = run(monkeypatch, capsys, lengths, cost, k=k, quiet_seconds=0.0, min_interval=0.0)
    assert len(lines) >= 4, lines
    total = ends[-1]
    for line in lines:
        percent, elapsed, left = parse(line)
        assert abs(elapsed + left - total) <= 1 + total * 0.01, (line, clock(total))
        assert abs(elapsed / total * 100 - percent) <= 1.5, line  # the share is the share of the time
    assert "(60/60 texts)" not in "".join(lines)  # 100% prints nothing: the metrics follow


def test_counting_texts_or_batches_would_run_short(monkeypatch, capsys):
    # the same test, cost per token: at the first line, time left by texts done would be far short
    lengths = [3] * 20 + [200] * 4
    lines, ends = run(monkeypatch, capsys, lengths, lambda t: t.numel() * 0.1, quiet_seconds=0.0, min_interval=0.0)
    percent, elapsed, left = parse(lines[0])
    texts_share = int(lines[0].split("(")[1].split("/")[0]) / 24
    assert abs(elapsed + left - ends[-1]) <= 1
    assert elapsed * (1 - texts_share) / texts_share < 0.5 * (ends[-1] - elapsed)


def test_no_two_lines_within_min_interval(monkeypatch, capsys):
    # 100 equal batches of 1 s each: quiet time ends at 39 s (39%), then 40% is crossed 1 s later;
    # that 40% line is skipped and the next is at 50%.
    lines, _ = run(monkeypatch, capsys, [5] * 100, lambda t: 1.0, batch_size=1, quiet_seconds=38.5, min_interval=10.0)
    assert [parse(x)[0] for x in lines] == [39, 50, 60, 70, 80, 90], lines
    assert lines[0] == "seqvae: test 39% (39/100 texts)  0:39 elapsed  ~1:01 left"
    # tenths crossed faster than min_interval (0.625 s each): every other one only, never two within 1 s
    lines, _ = run(monkeypatch, capsys, [5] * 100, lambda t: 0.0625, batch_size=1, quiet_seconds=0.0, min_interval=1.0)
    times = [parse(x)[1] for x in lines]
    assert [parse(x)[0] for x in lines] == [10, 30, 50, 70, 90], lines
    # the default: 10 s apart at least, also when one slow batch lets several tenths through at once
    lines, _ = run(monkeypatch, capsys, [5] * 100, lambda t: 0.5, batch_size=1)  # 50 s, quiet 30 s
    assert [parse(x)[0] for x in lines] == [60, 80], lines
    assert times == sorted(times)


def test_quiet_test_prints_nothing(monkeypatch, capsys):
    lines, _ = run(monkeypatch, capsys, [5] * 100, lambda t: 0.2, batch_size=1)  # 20 s < 30 s quiet
    assert lines == []
