"""The self-supervised objectives: the paper's masked patch prediction and MAE.

An objective is a small frozen dataclass with three jobs, so that
pre-training is plain `model.fit` on a `tf.data` pipeline on every backend,
with no `train_step` of its own:

- `build(encoder)`: a functional model around the layers of a ViT encoder
  (`ViT(include_top=False, pooling=None)`), with extra inputs
  that say which patches to corrupt or drop; the encoder's layers are
  shared, so after training `encoder` holds the pre-trained weights;
- `batches(data, model, seed)`: maps a pipeline's `(images, labels)`
  batches to `(inputs, targets, sample_weights)`: the masks and targets
  are computed in the pipeline, labels are dropped;
- `compile_arguments()`: the loss (averaged over the predicted patches only,
  through the sample weights) and metrics for `model.compile`.

Example:

```python
encoder = keras_vit.ViT(
    patch_size=4, hidden_dim=64, num_layers=4, num_heads=4, mlp_dim=128,
    input_shape=(28, 28, 1), include_top=False, pooling=None)
objective = keras_vit.pretraining.MaskedPatchPrediction()
model = objective.build(encoder)
model.compile(optimizer="adamw", **objective.compile_arguments())
train = keras_vit.data.fashion_mnist("train", image_size=28, channels=1,
                                     training=True, crop_scale=None)
model.fit(objective.batches(train.data, model), epochs=10)
classifier = keras_vit.ViT(..., classes=10)
keras_vit.pretraining.transfer_encoder(model, classifier)
```
"""

import dataclasses

import keras

from keras_vit import layers as vit_layers
from keras_vit.pretraining import masking

MPP_TARGETS = ("mean_color", "color_grid", "pixels")
# The layers of an encoder built by `ViT(include_top=False,
# pooling=None)`, one after the other (a chain: each takes the previous output).
_CHAIN_LAYERS = (
    "rescaling",
    "patch_embedding",
    "distillation_token",
    "class_token",
    "position_embedding",
    "register_tokens",
    "dropout",
    "encoder_norm",
)


@dataclasses.dataclass(frozen=True)
class PatchGeometry:
    """How a ViT cuts its images: patch size, grid, prefix tokens, channels."""

    patch_size: tuple
    grid_size: tuple
    num_prefix_tokens: int
    channels: int

    @property
    def num_patches(self):
        return self.grid_size[0] * self.grid_size[1]

    @property
    def patch_values(self):
        return self.patch_size[0] * self.patch_size[1] * self.channels


def patch_geometry(model):
    """The `PatchGeometry` of a keras_vit encoder, classifier or pre-training model."""
    try:
        embedding = model.get_layer("patch_embedding")
        positions = model.get_layer("position_embedding")
    except ValueError:
        raise ValueError(
            f"Model {model.name!r} has no 'patch_embedding' and 'position_embedding' "
            "layers; build it with keras_vit.VisionTransformer."
        ) from None
    prefix = positions.num_prefix_tokens
    if "register_tokens" in [layer.name for layer in model.layers]:
        prefix += model.get_layer("register_tokens").num_tokens
    return PatchGeometry(
        patch_size=tuple(embedding.patch_size),
        grid_size=tuple(positions.grid_size),
        num_prefix_tokens=prefix,
        channels=int(embedding.kernel.shape[2]),
    )


def encoder_chain(encoder):
    """The layers of a ViT encoder in order, checked to be usable for pre-training."""
    if not isinstance(encoder, keras.Model):
        raise TypeError(
            "`encoder` must be a keras_vit model built with include_top=False, "
            f"pooling=None. Received: encoder={encoder!r}"
        )
    names = [layer.name for layer in encoder.layers[1:]]
    if "stem" in names:
        raise ValueError(
            "Masked-patch objectives need patches of pixels: a convolutional stem's "
            "receptive field crosses patch borders and would show the encoder the "
            "pixels it must predict. Received: an encoder with a 'stem' layer "
            "(build it with stem_filters=None)."
        )
    unknown = [n for n in names if n not in _CHAIN_LAYERS and not n.startswith("encoderblock_")]
    if unknown or not names or names[-1] != "encoder_norm":
        raise ValueError(
            "`encoder` must be a ViT(include_top=False, pooling=None), "
            f"ending in 'encoder_norm'. Received layers {names}"
        )
    return encoder.layers[1:]


def _head_dtype():
    # Like the classifier's head: outputs in float32 under mixed precision.
    return keras.dtype_policies.get(keras.config.dtype_policy()).variable_dtype


def _check_fraction(name, value, low=0.0, high=1.0):
    if not isinstance(value, (int, float)) or not low < value < high:
        raise ValueError(
            f"`{name}` must be a number in ({low}, {high}). Received: {name}={value!r}"
        )


def _with_seeds(data, seed, transform):
    """Maps batches with a fresh stateless seed each, replayed by `seed`."""
    import tensorflow as tf

    from keras_vit.data.pipeline import graph_function

    # One random draw per batch; a new stream each epoch (like a
    # reshuffling shuffle), so a resumed run that re-creates as many
    # iterators as epochs were done gets the same masks as an unbroken one.
    draws = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)

    def apply(batch, draw):
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return transform(images, tf.stack([tf.cast(seed, tf.int64), draw]))

    return (
        tf.data.Dataset.zip(data, draws)
        .map(graph_function(apply), num_parallel_calls=2, deterministic=True)
        .prefetch(2)
    )


@dataclasses.dataclass(frozen=True)
class MaskedPatchPrediction:
    """The paper's masked patch prediction (§4.6, Appendix B.1.2).

    `corruption_rate` of the patch embeddings are corrupted: of those,
    `mask_fraction` become a learned `[mask]` embedding, `replace_fraction`
    the embedding of another patch of the image, and the rest stay as they
    are (80/10/10, as BERT). For every corrupted patch the model predicts,
    from the encoder's output token of that patch:

    - `"mean_color"` (the paper's choice): its mean colour quantised to
      `color_bits` bits a channel, one softmax over `2**(bits * channels)`
      classes (512 for RGB);
    - `"color_grid"`: the same for each cell of a `grid x grid` grid over
      the patch (the paper's "4x4 downsized" target, 16 x 512-way);
    - `"pixels"`: the whole patch in `[-1, 1]`, an L2 regression.

    The loss counts corrupted patches only.

    Args:
        target: `"mean_color"`, `"color_grid"` or `"pixels"`.
        corruption_rate: fraction of the patches to corrupt (and predict).
        mask_fraction: of the corrupted patches, the fraction replaced by `[mask]`.
        replace_fraction: of the corrupted patches, the fraction replaced
            by another patch's embedding.
        color_bits: bits per channel of the colour targets.
        grid: cells per side of `"color_grid"`.
    """

    target: str = "mean_color"
    corruption_rate: float = 0.5
    mask_fraction: float = 0.8
    replace_fraction: float = 0.1
    color_bits: int = 3
    grid: int = 4

    name = "mpp"

    def __post_init__(self):
        if self.target not in MPP_TARGETS:
            raise ValueError(
                f"`target` must be one of {MPP_TARGETS}. Received: target={self.target!r}"
            )
        _check_fraction("corruption_rate", self.corruption_rate)
        for name in ("mask_fraction", "replace_fraction"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"`{name}` must be in [0, 1]. Received: {name}={value!r}")
        if self.mask_fraction + self.replace_fraction > 1.0 + 1e-9:
            raise ValueError(
                "`mask_fraction + replace_fraction` must be at most 1. Received: "
                f"mask_fraction={self.mask_fraction!r}, replace_fraction={self.replace_fraction!r}"
            )
        if not isinstance(self.color_bits, int) or not 1 <= self.color_bits <= 8:
            raise ValueError(
                f"`color_bits` must be an int in [1, 8]. Received: color_bits={self.color_bits!r}"
            )
        if not isinstance(self.grid, int) or self.grid < 1:
            raise ValueError(f"`grid` must be a positive int. Received: grid={self.grid!r}")

    def num_classes(self, channels):
        """Classes of one colour target: `2 ** (color_bits * channels)`."""
        return 2 ** (self.color_bits * channels)

    def _check(self, geometry):
        if geometry.num_patches < 2:
            raise ValueError(
                "Masked patch prediction needs at least 2 patches; the model has "
                f"{geometry.num_patches}."
            )
        if self.target == "color_grid" and any(p % self.grid for p in geometry.patch_size):
            raise ValueError(
                f"target='color_grid' cuts each patch into a {self.grid}x{self.grid} grid, "
                f"which needs a patch size divisible by {self.grid}. Received: patch "
                f"size {geometry.patch_size}, grid={self.grid}"
            )

    def build(self, encoder, name="masked_patch_prediction"):
        """The pre-training model around `encoder`'s layers (shared).

        Inputs: `images`, `masked_patches` (int 0/1 per patch) and
        `source_patches` (int, per patch); output: logits `(batch, patches,
        classes)` (`(batch, patches, grid**2, classes)` for
        `"color_grid"`), or `(batch, patches, values)` for `"pixels"`.
        """
        chain = encoder_chain(encoder)
        geometry = patch_geometry(encoder)
        self._check(geometry)
        images = keras.Input(shape=encoder.input_shape[1:], name="images")
        mask = keras.Input(shape=(geometry.num_patches,), dtype="int32", name="masked_patches")
        source = keras.Input(shape=(geometry.num_patches,), dtype="int32", name="source_patches")
        x = images
        for layer in chain:
            x = layer(x)
            if layer.name == "patch_embedding":
                x = vit_layers.PatchCorruption(name="patch_corruption")([x, mask, source])
        x = vit_layers.SelectTokens(
            geometry.num_prefix_tokens, keep_prefix=False, name="patch_tokens"
        )(x)
        if self.target == "pixels":
            outputs = keras.layers.Dense(
                geometry.patch_values, name="mpp_head", dtype=_head_dtype()
            )(x)
        else:
            classes = self.num_classes(geometry.channels)
            cells = 1 if self.target == "mean_color" else self.grid**2
            outputs = keras.layers.Dense(cells * classes, name="mpp_head", dtype=_head_dtype())(x)
            if cells > 1:
                outputs = keras.layers.Reshape(
                    (geometry.num_patches, cells, classes), name="mpp_cells", dtype=_head_dtype()
                )(outputs)
        return keras.Model([images, mask, source], outputs, name=name)

    def targets(self, images, geometry):
        """The targets of a batch of `[0, 255]` images (pipeline side, TF)."""
        if self.target == "pixels":
            return masking.scaled_patch_pixels(images, geometry.patch_size)
        grid = 1 if self.target == "mean_color" else self.grid
        return masking.quantized_colors(images, geometry.patch_size, self.color_bits, grid)

    def batches(self, data, model, seed=0):
        """`(inputs, targets, sample_weights)` batches from `(images, ...)` batches.

        Args:
            data: `tf.data.Dataset` of image batches or `(images, labels)`
                batches (labels are dropped), pixels in `[0, 255]`.
            model: the pre-training model or its encoder (for the geometry).
            seed: int, the masks' seed.
        """
        import tensorflow as tf

        geometry = patch_geometry(model)
        self._check(geometry)
        cells = self.grid**2 if self.target == "color_grid" else 1

        def transform(images, batch_seed):
            chosen, mask, source = masking.corruption_plan(
                batch_seed,
                tf.shape(images)[0],
                geometry.num_patches,
                self.corruption_rate,
                self.mask_fraction,
                self.replace_fraction,
            )
            weights = chosen if cells == 1 else tf.repeat(chosen[..., None], cells, axis=-1)
            inputs = {"images": images, "masked_patches": mask, "source_patches": source}
            return inputs, self.targets(images, geometry), weights

        return _with_seeds(data, seed, transform)

    def compile_arguments(self):
        """`loss` and `weighted_metrics` for `model.compile`, over corrupted patches only."""
        if self.target == "pixels":
            return {
                "loss": keras.losses.MeanSquaredError(reduction="mean_with_sample_weight"),
                "metrics": [],
                "weighted_metrics": [],
            }
        return {
            "loss": keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight"
            ),
            "metrics": [],
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }


@dataclasses.dataclass(frozen=True)
class MaskedAutoencoder:
    """MAE (He et al. 2021): encode the visible patches, reconstruct the others.

    `mask_ratio` of the patches (a random subset per image) are dropped
    before the encoder, which sees only the rest (with their position
    embeddings, and the class token). A light decoder (`decoder_depth`
    Transformer blocks of width `decoder_dim`, fixed sin-cos positions)
    gets the encoded tokens back in place with a learned `[mask]` token at
    every dropped patch and regresses each patch's pixels; the loss is the
    squared error on dropped patches only, against per-patch normalised
    pixels (`normalize_targets`, MAE's `norm_pix_loss`) or `[-1, 1]` pixels.

    Args:
        mask_ratio: fraction of the patches dropped.
        decoder_dim: width of the decoder (MAE: 512).
        decoder_depth: decoder blocks (MAE: 8).
        decoder_heads: attention heads of the decoder (MAE: 16).
        decoder_mlp_dim: MLP width of the decoder; `None`: 4 x `decoder_dim`.
        normalize_targets: bool, per-patch normalised target pixels.
    """

    mask_ratio: float = 0.75
    decoder_dim: int = 512
    decoder_depth: int = 8
    decoder_heads: int = 16
    decoder_mlp_dim: int = None
    normalize_targets: bool = True

    name = "mae"

    def __post_init__(self):
        _check_fraction("mask_ratio", self.mask_ratio)
        for name in ("decoder_dim", "decoder_depth", "decoder_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")
        if self.decoder_dim % self.decoder_heads:
            raise ValueError(
                f"decoder_dim {self.decoder_dim} is not divisible by "
                f"decoder_heads {self.decoder_heads}."
            )

    def num_kept(self, geometry):
        return int(geometry.num_patches * (1 - self.mask_ratio))

    def _check(self, geometry):
        kept = self.num_kept(geometry)
        if not 1 <= kept < geometry.num_patches:
            raise ValueError(
                f"mask_ratio={self.mask_ratio} keeps {kept} of the model's "
                f"{geometry.num_patches} patches; it must keep at least one and drop at least one."
            )

    def build(self, encoder, name="masked_autoencoder"):
        """The MAE model around `encoder`'s layers (shared) and a new decoder.

        Inputs: `images`, `kept_patches` (int `(kept,)`, the visible
        patches) and `restore_order` (int `(patches,)`); output: pixel
        predictions `(batch, patches, ph * pw * channels)`.
        """
        chain = encoder_chain(encoder)
        geometry = patch_geometry(encoder)
        self._check(geometry)
        # The decoder's blocks take the encoder's GELU form and LayerNorm epsilon.
        blocks = [layer for layer in chain if layer.name.startswith("encoderblock_")]
        block_config = blocks[-1].get_config() if blocks else {}
        images = keras.Input(shape=encoder.input_shape[1:], name="images")
        kept = keras.Input(shape=(self.num_kept(geometry),), dtype="int32", name="kept_patches")
        restore = keras.Input(shape=(geometry.num_patches,), dtype="int32", name="restore_order")
        embedded_prefix = encoder.get_layer("position_embedding").num_prefix_tokens
        x = images
        for layer in chain:
            x = layer(x)
            if layer.name == "position_embedding":
                x = vit_layers.SelectTokens(embedded_prefix, name="visible_tokens")([x, kept])
        prefix = geometry.num_prefix_tokens
        x = keras.layers.Dense(self.decoder_dim, name="decoder_embedding")(x)
        x = vit_layers.RestoreMaskedTokens(prefix, name="decoder_mask_tokens")([x, restore])
        x = vit_layers.PositionEmbedding(
            geometry.grid_size,
            num_prefix_tokens=prefix,
            kind="sincos2d",
            name="decoder_position_embedding",
        )(x)
        epsilon = block_config.get("layer_norm_epsilon", 1e-6)
        for index in range(self.decoder_depth):
            x = vit_layers.TransformerBlock(
                num_heads=self.decoder_heads,
                mlp_dim=self.decoder_mlp_dim or 4 * self.decoder_dim,
                approximate_gelu=block_config.get("approximate_gelu", True),
                layer_norm_epsilon=epsilon,
                name=f"decoderblock_{index}",
            )(x)
        x = vit_layers.LayerNormalization(epsilon=epsilon, name="decoder_norm")(x)
        x = vit_layers.SelectTokens(prefix, keep_prefix=False, name="decoder_patches")(x)
        outputs = keras.layers.Dense(
            geometry.patch_values, name="decoder_prediction", dtype=_head_dtype()
        )(x)
        return keras.Model([images, kept, restore], outputs, name=name)

    def targets(self, images, geometry):
        """The pixel targets of a batch of `[0, 255]` images (pipeline side, TF)."""
        if self.normalize_targets:
            return masking.normalized_patch_pixels(images, geometry.patch_size)
        return masking.scaled_patch_pixels(images, geometry.patch_size)

    def batches(self, data, model, seed=0):
        """`(inputs, targets, sample_weights)` batches; see `MaskedPatchPrediction.batches`."""
        import tensorflow as tf

        geometry = patch_geometry(model)
        self._check(geometry)

        def transform(images, batch_seed):
            kept, restore, masked = masking.keep_plan(
                batch_seed, tf.shape(images)[0], geometry.num_patches, self.mask_ratio
            )
            inputs = {"images": images, "kept_patches": kept, "restore_order": restore}
            return inputs, self.targets(images, geometry), masked

        return _with_seeds(data, seed, transform)

    def compile_arguments(self):
        """The squared error over dropped patches only (MAE's loss)."""
        return {
            "loss": keras.losses.MeanSquaredError(reduction="mean_with_sample_weight"),
            "metrics": [],
            "weighted_metrics": [],
        }


OBJECTIVES = {"mpp": MaskedPatchPrediction, "mae": MaskedAutoencoder}


def get_objective(objective, **options):
    """An objective from its name (`"mpp"`, `"mae"`) and options, or as given."""
    if isinstance(objective, (MaskedPatchPrediction, MaskedAutoencoder)):
        if options:
            return dataclasses.replace(objective, **options)
        return objective
    if objective not in OBJECTIVES:
        raise ValueError(
            f"`objective` must be one of {tuple(OBJECTIVES)}. Received: objective={objective!r}"
        )
    return OBJECTIVES[objective](**options)
