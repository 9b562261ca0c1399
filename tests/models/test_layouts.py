"""Which layouts the rotation and quantization-aware training take: one rule, asked everywhere."""

import re
import types

import numpy as np
import pytest

import keras_vit
from keras_vit.models import layouts, quantization_aware_copy
from keras_vit.training import train_job
from tests.conftest import TINY

REFUSED = [
    dict(pooling="max"),
    dict(pooling="token_gap"),
    dict(position_embedding="sincos2d"),
    dict(stem_filters=(8,), patch_size=2),
    dict(representation_size=8),
    dict(distillation_token=True),
]


@pytest.mark.backend_independent
def test_the_plain_layouts_are_taken_and_each_other_is_named():
    assert layouts.qat_unsupported(TINY) == {}
    assert layouts.qat_unsupported({**TINY, "pooling": "gap", "class_token": False}) == {}
    assert layouts.qat_unsupported({**TINY, "pooling": "map", "class_token": False}) == {}
    assert layouts.qat_unsupported({**TINY, "layer_scale_init": 0.1}) == {}  # (folded)
    for change in REFUSED:
        refused = layouts.qat_unsupported({**TINY, **change})
        assert set(refused) & set(change), change
    assert layouts.unrotatable({"distillation_token": True}) == {}  # (two plain heads)


@pytest.mark.parametrize("change", REFUSED, ids=lambda change: next(iter(change.items()))[0])
def test_the_copy_the_constructor_and_the_training_job_refuse_alike(change):
    arguments = {**TINY, **change}
    expected = layouts.described(layouts.qat_unsupported(arguments))
    images = np.zeros((32, 16, 16, 3), "float32")
    with pytest.raises(ValueError, match=re.escape(expected)):
        quantization_aware_copy(keras_vit.ViT(**arguments), "int8", images)
    with pytest.raises(ValueError, match=re.escape(expected)):
        keras_vit.ViT(**arguments, qat="int8")
    settings = types.SimpleNamespace(qat="int8", weights="run/model.keras", lora=None, teacher=None)
    with pytest.raises(ValueError, match=re.escape(expected)):
        train_job._check_qat(settings, arguments)
