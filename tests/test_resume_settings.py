"""Which settings a resume may change (seqvae/training/resume.py): the comparison of a command's
settings with the checkpoint's run, on constructed configs. The CLI end to end is in
tests/test_cli.py (test_resume_with_settings_that_change_the_computation_is_one_error_line)."""

from __future__ import annotations

from seqvae.training.resume import differences, flatten, may_change
from seqvae.training.retest import EVAL_KEYS


def test_flatten_gives_dotted_keys_and_keeps_lists_and_empty_sections():
    tree = {"model": {"lr": 1.0, "kl_schedule": {"class_path": "a.B", "init_args": {"start": 0.1}}, "regularizers": [1]},
            "data": {}, "seed_everything": 1}  # fmt: skip
    assert flatten(tree) == {
        "model.lr": 1.0,
        "model.kl_schedule.class_path": "a.B",
        "model.kl_schedule.init_args.start": 0.1,
        "model.regularizers": [1],
        "data": {},
        "seed_everything": 1,
    }


def test_differences_name_each_changed_key_once_at_the_depth_where_the_sides_part():
    recorded = flatten({"model": {"lr": 1.0, "pooling": "max", "kl_penalty": None}, "data": {"label_column": False}})
    now = flatten(
        {
            "model": {"lr": 1.0, "pooling": "avg", "kl_penalty": {"class_path": "seqvae.FreeBits", "init_args": {"target": 8}}},
            "data": {"label_column": None},  # the datamodule records "none" as False, a config as null
            "trainer": {"max_epochs": 3},  # a key the record does not know: not a difference
        }
    )
    assert differences(now, recorded) == {"model.pooling": ("max", "avg"), "model.kl_penalty": (None, "FreeBits")}
    assert differences(recorded, recorded) == {}
    assert differences(flatten({"model": {"latent_dim": 0}}), flatten({"model": {"latent_dim": False}})) != {}


def test_what_a_resume_may_change():
    for key in ("trainer.max_epochs", "trainer.logger.init_args.version", "periodic_checkpoint.every_n_batches",
                "model.test_iw_samples", "model.generation.seed", "data.test", "ckpt_path"):  # fmt: skip
        assert may_change(key), key
    for key in ("model.lr", "model.pooling", "model.kl_schedule.init_args.start", "data.train", "data.batch_size",
                "plateau.patience", "seed_everything", "trainer.precision", "trainer.max_epochsX",
                "model.generationX"):  # fmt: skip
        assert not may_change(key), key


def test_every_evaluation_key_a_retest_keeps_may_also_change_on_resume():
    """AIS at test (`--model.ais`) is an evaluation setting like K: changing it on a resume is not refused."""
    assert "ais" in EVAL_KEYS
    assert [k for k in EVAL_KEYS if not may_change(f"model.{k}")] == []
    assert may_change("model.ais.init_args.steps")
