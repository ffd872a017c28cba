"""The digits quality check: the judge classifier, the Fréchet distance and the evaluation loop."""

import numpy as np
import pytest
import torch

from nala_gen.diffusion.quality import evaluate, frechet_distance, train_classifier


def test_frechet_distance_is_zero_for_equal_sets_and_grows_with_a_shift():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(500, 8))
    assert abs(frechet_distance(a, a)) < 1e-6
    assert frechet_distance(a, a + 1.0) == pytest.approx(8.0, rel=0.05)  # |mean shift|^2 = 8


def test_classifier_learns_the_real_digits():
    _, accuracy, held_out = train_classifier(16, 1, seed=0, epochs=12)  # 8 sat at the 0.9 line (0.89 on one thread)
    assert accuracy > 0.9
    assert len(held_out) == 1797 - int(0.8 * 1797)  # the 20 % it never trained on


def test_evaluate_runs_on_a_pipeline():
    from diffusers import DDIMScheduler

    from nala_gen.diffusion import NaLaDiTPipeline, NaLaDiTTransformer2DModel

    torch.manual_seed(0)
    model = NaLaDiTTransformer2DModel.from_size(
        "tiny", sample_size=16, in_channels=1, num_classes=10, learn_sigma=False
    )
    pipe = NaLaDiTPipeline(model, DDIMScheduler())
    result = evaluate(pipe, per_class=2, steps=2, cfg=2.0, batch=8, classifier_epochs=12)
    assert result["samples"] == 20 and abs(result["accuracy"] * 20 - round(result["accuracy"] * 20)) < 1e-6  # k of 20
    assert result["accuracy"] < 0.5  # an untrained model draws no digits the classifier recognises
    assert result["classifier_held_out_accuracy"] > 0.9
    assert result["svc_held_out_accuracy"] > 0.9 and result["svc_accuracy"] < 0.5  # the second judge agrees
    assert len(result["svc_per_class_accuracy"]) == 10
    assert result["frechet_distance"] > 0  # an untrained model is far from the real digits
    # the row says what attention made the samples, read from the model (here the paper's block, all parts on)
    assert result["attention"] == {"kernel": "nala", "kernel_options": None, "rope": True, "lepe": True, "gate": True}


def test_second_judge_reads_the_digits_as_scikit_learn_stores_them_and_knows_them():
    from sklearn.datasets import load_digits

    from nala_gen.diffusion.data import DigitsDataset
    from nala_gen.diffusion.quality import to_digit_grid, train_second_judge

    native = DigitsDataset(8, 1)
    assert np.allclose(to_digit_grid(native.images), load_digits().data)  # 8x8 in [-1, 1] -> 0..16, exactly
    for size, channels in ((16, 1), (32, 3)):
        data = DigitsDataset(size, channels)
        judge, held_out = train_second_judge(data)
        assert held_out > 0.9  # on the half it never saw, after the samples' own round trip
        noise = torch.rand(200, channels, size, size) * 2 - 1
        labels = torch.arange(10).repeat(20).numpy()
        assert (judge.predict(to_digit_grid(noise)) == labels).mean() < 0.3  # noise is no digit it knows
