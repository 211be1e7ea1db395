"""benchmarks/trainer_path.py and bench.py's parts that use it (issue 46 item 6): the benchmark times
the real training step through `Trainer.fit` and IW-NLL through `Trainer.test` in the test's shape,
over exactly the timed batches, after warm-up batches of the same shapes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: benchmarks/
from benchmarks import bench, trainer_path  # noqa: E402
from seqvae.core.model import SeqVAE  # noqa: E402

CPU = torch.device("cpu")
TINY = dict(vocab_size=50, embed_dim=8, hidden_dim=8, latent_dim=2)


def batches(n: int, b: int = 4, t: int = 6) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [{"tokens": torch.randint(4, 50, (b, t), generator=g), "lengths": torch.full((b,), t)} for _ in range(n)]


@pytest.fixture
def training_steps(monkeypatch):
    """Counts the calls of the real SeqVAE.training_step (which still runs)."""
    calls = [0]
    real = SeqVAE.training_step

    def counted(self, batch, batch_idx):
        calls[0] += 1
        return real(self, batch, batch_idx)

    monkeypatch.setattr(SeqVAE, "training_step", counted)
    return calls


def test_timed_fit_runs_warm_up_and_timed_steps_through_the_real_training_step(training_steps):
    timed = batches(3)
    torch.manual_seed(0)
    model = SeqVAE(**TINY)
    before = [p.detach().clone() for p in model.parameters()]
    r = trainer_path.timed_fit(model, timed[:2] + timed, 2, CPU)
    assert training_steps[0] == 5  # 2 warm-up + 3 timed, every one through training_step
    assert (r["steps"], r["batches_run"]) == (3, 5)
    assert r["s_per_step"] > 0 and r["cpu_s_per_step"] > 0
    assert r["s_per_step"] == pytest.approx(r["wall_s"] / 3) and r["cpu_s_per_step"] == pytest.approx(r["cpu_s"] / 3)
    assert model.num_updates == 5 and any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # SGD stepped


def test_the_timed_span_holds_exactly_the_timed_steps(training_steps, monkeypatch):
    """A clock that reads the number of training steps run: the span is the timed steps, no warm-up step."""
    monkeypatch.setattr(trainer_path, "stamp", lambda device: (float(training_steps[0]), 0.0))
    timed = batches(3)
    r = trainer_path.timed_fit(SeqVAE(**TINY), timed[:2] + timed, 2, CPU)
    assert r["wall_s"] == 3.0 and r["s_per_step"] == 1.0


def test_timed_test_decodes_one_call_per_warm_up_batch_and_k_samples_per_timed_text(monkeypatch):
    """Trainer.test with the model's test_step: a warm-up batch decodes one IW decoder call of the
    timed size (plus the reconstruction's one sample), a timed batch K samples in calls of
    `iw_chunk`; the clock (reading the samples decoded) spans the timed batches only."""
    torch.manual_seed(0)
    per_sample = 4 * 6 * 50  # B·T·V: iw_chunk's logits per sample
    model = SeqVAE(**TINY, iw_max_elements=3 * per_sample)  # 3 samples per decoder call
    decoded, calls, real = [0], [], model.decoder.log_likelihood

    def counted(tokens, lengths, z, *a, **k):
        decoded[0] += z.size(1)
        calls.append(z.size(1))
        return real(tokens, lengths, z, *a, **k)

    monkeypatch.setattr(model.decoder, "log_likelihood", counted)
    monkeypatch.setattr(trainer_path, "stamp", lambda device: (float(decoded[0]), 0.0))
    timed = batches(2)
    r = trainer_path.timed_test(model, timed[:1] + timed, 1, CPU, n_samples=7)
    assert calls == [1, 3] + [1, 3, 3, 1] * 2  # warm-up: rec + one IW call; timed: rec + 7 samples in 3 + 3 + 1
    assert r["wall_s"] == 2 * (1 + 7)  # the two timed batches' samples
    assert (r["texts"], r["batches"], r["batches_run"], r["K"]) == (8, 2, 3, 7)
    assert r["samples_per_decoder_call"] == [3, 3] and r["s_per_text"] == 2.0
    assert model.hparams.test_iw_samples == 500  # the model's own K is given back


def test_bench_measures_the_trainer_path_and_the_test_shape_in_cpu_seconds(monkeypatch, tmp_path, training_steps):
    """bench.py's `fit` and `test` parts (a tiny config on synthetic Yahoo-length batches of 32)."""
    monkeypatch.setitem(bench.CONFIGS, "small", TINY)
    spec = dict(device="cpu", bf16=False, config="small", quick=True, data=str(tmp_path / "none.txt"), fused=True, iw_samples=4)
    warm, steps, _, n_test = bench.sizes("small", True, "cpu")
    fit = bench.measure({**spec, "part": "fit"})
    assert training_steps[0] == warm + steps and fit["fit"]["steps"] == steps
    assert fit["cpu_s"] > 0 and fit["seconds"] > 0 and fit["tf32"] == "n/a (cpu)" and len(fit["loadavg_1min"]) == 2
    test = bench.measure({**spec, "part": "test"})
    assert test["test"]["texts"] == n_test * bench.BATCH and test["test"]["K"] == 4
    assert test["cpu_s"] > 0 and len(test["lengths"]) == n_test


def test_the_tf32_state_is_read_as_the_measurement_left_it():
    """On CUDA the three settings `set_tf32` makes (read back, not assumed); on the CPU none exists."""
    cuda = type("Device", (), {"type": "cuda"})()
    kept = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        bench.set_tf32(True)
        assert bench.tf32_state(cuda) == {"matmul_fp32_precision": "tf32", "matmul_allow_tf32": True, "cudnn_allow_tf32": True}
        bench.set_tf32(False)
        assert bench.tf32_state(cuda) == {"matmul_fp32_precision": "ieee", "matmul_allow_tf32": False, "cudnn_allow_tf32": False}
        torch.backends.cudnn.allow_tf32 = True  # torch's own default: the LSTM in TF32, matmuls in fp32
        assert bench.tf32_state(cuda) == {"matmul_fp32_precision": "ieee", "matmul_allow_tf32": False, "cudnn_allow_tf32": True}
    finally:  # torch's state as it was
        torch.set_float32_matmul_precision(kept[0])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = kept[1:]
    assert bench.tf32_state(CPU) == "n/a (cpu)"


def test_row_cost_times_each_rows_own_config_through_the_real_training_step(tmp_path, monkeypatch, training_steps):
    """benchmarks/row_cost.py builds each row's model from configs/<dataset>/{base,<row>}.yaml, as `seqvae fit`
    would (SA-VAE's refinement and iVAE's critic and posterior switched on by their own configs), and times
    warm + steps real training steps of it on the loader's first batches."""
    from test_model import write_corpus

    from benchmarks import row_cost

    repo = Path(__file__).resolve().parents[1]
    for name, seed in (("train", 0), ("valid", 1), ("test", 2)):
        write_corpus(tmp_path / f"{name}.txt", 40, seed)
    (tmp_path / "configs" / "tiny").mkdir(parents=True)
    base = (
        f"data: {{train: {tmp_path / 'train.txt'}, val: {tmp_path / 'valid.txt'}, test: {tmp_path / 'test.txt'}, "
        "batch_size: 8}\n"
        "model: {embed_dim: 8, hidden_dim: 12, latent_dim: 4, val_iw_samples: 0, test_iw_samples: 2}\n"
        "trainer: {logger: {class_path: pytorch_lightning.loggers.TensorBoardLogger, init_args: {save_dir: runs}}}\n"
    )
    (tmp_path / "configs" / "tiny" / "base.yaml").write_text(base)
    for row in ("last", "sa_vae", "ivae"):  # the shipped rows' overlays, on the tiny base
        (tmp_path / "configs" / "tiny" / f"{row}.yaml").write_text((repo / "configs" / "yahoo10k" / f"{row}.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    expected = {
        "last": {"kl_penalty": "StandardKL", "refine": "NoneType", "posterior": "GaussianPosterior"},
        "sa_vae": {"kl_penalty": "StandardKL", "refine": "SVIRefinement", "posterior": "GaussianPosterior"},
        "ivae": {"kl_penalty": "DualKL", "refine": "NoneType", "posterior": "FullCovGaussianPosterior"},
    }
    for row, strategies in expected.items():
        calls = training_steps[0]
        r = row_cost.measure("tiny", row, steps=2, warm=1)
        assert r["strategies"] == strategies, row
        assert training_steps[0] - calls == 3 and r["steps"] == 2 and r["cpu_s_per_step"] > 0, row
        assert len(r["batches"]) == 2 and all(b <= 8 for b, _ in r["batches"])
