"""Batch augmentation for training pipelines: RandAugment, MixUp, CutMix.

All three come from Keras core (`keras.layers.RandAugment`, `MixUp`,
`CutMix`), run inside `tf.data` on any backend. Presets follow AugReg
("How to train your ViT?", Steiner et al. 2021): `light` is RandAugment
(2 ops, magnitude 10), `medium` adds MixUp alpha 0.2 at magnitude 15,
`strong` MixUp alpha 0.5 at magnitude 20 (their light1 / medium1 / strong1).
RandAugment magnitudes are out of 30 (`factor = magnitude / 30`).
"""

import dataclasses

from keras_vit import _options


@dataclasses.dataclass(frozen=True)
class AugmentationConfig:
    """Batch augmentation settings.

    Attributes:
        randaugment_ops: int, RandAugment operations per image (0: off).
        randaugment_magnitude: float in `[0, 30]`.
        mixup_alpha: float, MixUp's Beta parameter (0: off).
        cutmix_alpha: float, CutMix's Beta parameter (0: off). With both
            MixUp and CutMix, each batch gets one of the two at random.
    """

    randaugment_ops: int = 0
    randaugment_magnitude: float = 0.0
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0


PRESETS = {
    "none": AugmentationConfig(),
    "light": AugmentationConfig(2, 10.0),
    "medium": AugmentationConfig(2, 15.0, mixup_alpha=0.2),
    "strong": AugmentationConfig(2, 20.0, mixup_alpha=0.5),
}


def get_config(augmentation):
    """An `AugmentationConfig` from a preset name, a config or a dict."""
    if augmentation is None:
        return PRESETS["none"]
    if isinstance(augmentation, AugmentationConfig):
        return augmentation
    if isinstance(augmentation, dict):
        return AugmentationConfig(**augmentation)
    if augmentation not in PRESETS:
        raise ValueError(
            f"{_options.name('augmentation')} must be one of {tuple(PRESETS)}, an "
            "AugmentationConfig or a dict. "
            f"Received: {_options.given('augmentation', augmentation)}"
        )
    return PRESETS[augmentation]


def batch_augmentation(augmentation, seed=0):
    """A `(images, one_hot_labels) -> (images, labels)` batch function, or `None`.

    Images are `[0, 255]` float batches; labels one-hot floats, which MixUp
    and CutMix mix in the same proportion as the pixels.

    Example:

    >>> import numpy as np
    >>> augment = batch_augmentation({"mixup_alpha": 0.4})
    >>> images = np.stack([np.zeros((8, 8, 3)), 255 * np.ones((8, 8, 3))])
    >>> labels = np.eye(2)
    >>> mixed_images, mixed_labels = augment(images.astype("float32"), labels.astype("float32"))
    >>> tuple(mixed_labels.shape)
    (2, 2)
    """
    import keras
    import tensorflow as tf

    config = get_config(augmentation)
    if config.randaugment_ops < 0 or not 0 <= config.randaugment_magnitude <= 30:
        raise ValueError(f"Invalid RandAugment settings in {config}.")
    if config.mixup_alpha < 0 or config.cutmix_alpha < 0:
        raise ValueError(f"MixUp/CutMix alphas must be >= 0. Received: {config}")
    randaugment = mixup = cutmix = None
    if config.randaugment_ops:
        randaugment = keras.layers.RandAugment(
            value_range=(0, 255),
            num_ops=config.randaugment_ops,
            factor=config.randaugment_magnitude / 30.0,
            seed=seed,
        )
    if config.mixup_alpha:
        mixup = keras.layers.MixUp(alpha=config.mixup_alpha, seed=seed + 1)
    if config.cutmix_alpha:
        cutmix = keras.layers.CutMix(factor=config.cutmix_alpha, seed=seed + 2)
    if randaugment is None and mixup is None and cutmix is None:
        return None
    generator = tf.random.Generator.from_seed(seed + 3)

    def augment(images, labels):
        if randaugment is not None:
            images = randaugment(images)
        mixers = [m for m in (mixup, cutmix) if m is not None]
        if not mixers:
            return images, labels
        if len(mixers) == 1:
            out = mixers[0]({"images": images, "labels": labels})
            return out["images"], out["labels"]

        def mix(layer):
            def apply():
                out = layer({"images": images, "labels": labels})
                return out["images"], out["labels"]

            return apply

        return tf.cond(generator.uniform(()) < 0.5, mix(mixers[0]), mix(mixers[1]))

    return augment
